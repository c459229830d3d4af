"""The reference clock: a shared machine's drift measured with a reference pass and taken out
of the profiler's and the engine's times (``specsim.engine.speed_reference``)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from specsim.engine.clock import start_clock  # noqa: E402
from specsim.engine.speed_reference import ReferenceClockSetting  # noqa: E402
from specsim.engine.speed_reference.clock import ReferenceClock  # noqa: E402
from specsim.engine.speed_reference.normaliser import SpeedNormaliser  # noqa: E402
from specsim.engine.speed_reference.probes import ReferencePass  # noqa: E402
from specsim.errors import SpecsimError  # noqa: E402
from specsim.profile.provenance import SpeedReference  # noqa: E402
from specsim.profiling import timing  # noqa: E402


class ScriptedPass:
    """A reference pass whose probes take the given seconds, one after another."""

    def __init__(self, *seconds, tokens=1):
        self.seconds = list(seconds)
        self.calls = []
        self.tokens = tokens
        self.model = object()  # the model the pass runs: identifies the target
        self.now = time.process_time

    def median_s(self, passes=5):
        self.calls.append(passes)
        return self.seconds.pop(0)


class FakeCpu:
    """A process clock that only moves when told to."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_normaliser_rescales_to_the_reference_and_probes_on_schedule(monkeypatch):
    cpu = FakeCpu()
    monkeypatch.setattr(time, "process_time", cpu)
    probe = ScriptedPass(2e-3, 4e-3, 1e-3)
    prefill = ScriptedPass(8e-3, 8e-3, 8e-3, tokens=96)
    host = ScriptedPass(5e-4, 5e-4, 1e-3)
    normaliser = SpeedNormaliser(
        probe,
        reference_s=2e-3,
        interval_s=0.25,
        prefill=prefill,
        reference_prefill_s=8e-3,
        host=host,
        reference_host_s=5e-4,
    )
    target = probe.model
    assert normaliser.factor(1, target) == pytest.approx(1.0)  # first call probes
    cpu.t += 0.1
    assert normaliser.factor(1, target) == pytest.approx(1.0)  # within the interval: no probe
    cpu.t += 0.2
    assert normaliser.factor(1, target) == pytest.approx(0.5)  # twice as slow: times count half
    assert normaliser.current() == pytest.approx(1.0)  # the engine's own work: the host probe's
    cpu.t += 0.3
    assert normaliser.factor(1, target) == pytest.approx(2.0)
    assert normaliser.current() == pytest.approx(0.5)
    assert normaliser.target.probes_s == [2e-3, 4e-3, 1e-3]
    drift = normaliser.drift()
    assert drift["probes"] == 3 and drift["slowdown_median"] == pytest.approx(1.0)
    assert drift["slowdown_p90"] > 1.5 and drift["slowdown_p10"] < 0.8
    assert drift["reference_host_s"] == 5e-4 and drift["host_slowdown_median"] == 1.0
    # Without references, the quiet speed: the fastest of 10 bursts, in rounds over every probe
    # (a slow phase at the start does not become the reference), before the first probe.
    order = []

    class Logged(ScriptedPass):
        def median_s(self, passes=5):
            order.append(self.label)
            return super().median_s(passes)

    decode = Logged(9e-3, 9e-3, 3e-3, 4e-3, 3.5e-3, *[5e-3] * 5, 6e-3)
    prefill = Logged(*[9e-3] * 11, tokens=96)
    host = Logged(2e-3, 1e-3, *[3e-3] * 9)
    decode.label, prefill.label, host.label = "decode", "prefill", "host"
    calibrated = SpeedNormaliser(decode, interval_s=0.25, prefill=prefill, host=host)
    assert calibrated.reference_s is None  # nothing is timed on construction
    assert calibrated.factor(1, decode.model) == pytest.approx(0.5)
    assert calibrated.reference_s == 3e-3 and calibrated.reference_prefill_s == 9e-3
    assert calibrated.host.reference_s == 1e-3 and calibrated.current() == pytest.approx(1 / 3)
    assert order[:6] == ["decode", "prefill", "host"] * 2  # interleaved rounds
    assert order.count("decode") == 11  # 10 calibration bursts, then the first probe
    calibrated.calibrate()
    assert order.count("decode") == 11  # calibrated once


def test_the_factor_moves_from_the_decode_probes_to_the_prefill_probes_with_the_tokens_fed(
    monkeypatch,
):
    monkeypatch.setattr(time, "process_time", FakeCpu())
    # Decodes as fast as at the reference, prefills twice as slow.
    decode = ScriptedPass(2e-3)
    normaliser = SpeedNormaliser(
        decode,
        reference_s=2e-3,
        prefill=ScriptedPass(16e-3, tokens=96),
        reference_prefill_s=8e-3,
        host=ScriptedPass(1e-3),
        reference_host_s=1e-3,
    )
    target = decode.model
    assert normaliser.factor(1, target) == pytest.approx(1.0)
    assert normaliser.current(96, target) == pytest.approx(0.5)
    assert normaliser.current(4096, target) == pytest.approx(0.5)  # wider: the probe's factor
    # Between them, geometric in log(tokens): sqrt(96) tokens sit halfway.
    assert normaliser.current(96**0.5, target) == pytest.approx(0.5**0.5)
    factors = [normaliser.current(tokens, target) for tokens in (1, 8, 40)]
    assert factors[0] > factors[1] > factors[2] > 0.5
    drift = normaliser.drift()
    assert drift["slowdown_median"] == pytest.approx(1.0)
    assert drift["prefill_slowdown_median"] == pytest.approx(2.0)


def test_a_tracked_drafter_is_rescaled_by_its_own_probes(monkeypatch):
    monkeypatch.setattr(time, "process_time", FakeCpu())
    target, drafter = (SimpleNamespace(config=SimpleNamespace(max_position=256)) for _ in "td")
    probe = ScriptedPass(4e-3, 4e-3)  # the target's decodes run twice as slow ...
    probe.model, probe.now = target, time.process_time
    normaliser = SpeedNormaliser(
        probe,
        2e-3,
        prefill=ScriptedPass(8e-3, tokens=96),
        reference_prefill_s=8e-3,
        host=ScriptedPass(1e-3),
        reference_host_s=1e-3,
    )
    own = normaliser.track(drafter, "small", reference_s=1e-3, reference_prefill_s=3e-3)
    own.decode = ScriptedPass(1e-3)  # ... the drafter's as fast as at its reference
    own.prefill = ScriptedPass(6e-3, tokens=96)  # and its prefills twice as slow
    assert normaliser.factor(1, target) == pytest.approx(0.5)
    assert normaliser.current(1, drafter) == pytest.approx(1.0)
    assert normaliser.current(96, drafter) == pytest.approx(0.5)
    assert normaliser.current(1) == pytest.approx(1.0)  # None: the engine's own work
    assert normaliser.track(target, "target") is normaliser.target
    with pytest.raises(ValueError, match="track"):
        normaliser.current(1, object())
    drift = normaliser.drift()
    assert drift["slowdown_median"] == pytest.approx(2.0)
    assert drift["models"]["small"] == pytest.approx(
        {
            "decode_s": 1e-3,
            "prefill_s": 3e-3,
            "slowdown_median": 1.0,
            "slowdown_p10": 1.0,
            "slowdown_p90": 1.0,
            "prefill_slowdown_median": 2.0,
            "prefill_slowdown_p10": 2.0,
            "prefill_slowdown_p90": 2.0,
        }
    )


def test_reference_clock_counts_each_pass_at_its_models_factor_and_leaves_probes_out(
    monkeypatch,
):
    cpu = FakeCpu()
    monkeypatch.setattr(time, "process_time", cpu)
    target, drafter = object(), object()

    class Normaliser:
        def __init__(self):
            self.value = {(None, 1.0): 1.0, (target, 96.0): 1.0, (drafter, 8.0): 0.8}

        def refresh(self):
            cpu.t += 0.01  # a probe costs CPU time that must not reach the clock

        def current(self, tokens=1.0, model=None):
            return self.value[model, float(tokens)]

    normaliser = Normaliser()
    clock = ReferenceClock(normaliser)
    start = clock.now()
    cpu.t += 1.0
    assert clock.now() - start == pytest.approx(1.0)
    normaliser.value[None, 1.0] = 0.5  # twice as slow now: the next stretch counts half
    before = clock.now()
    cpu.t += 1.0
    assert clock.now() - before == pytest.approx(0.5)
    # An iteration: engine work (the target's decode factor), a drafter pass of 8 tokens (the
    # drafter's factor), a 96-token target pass (that width's), engine work again.
    normaliser.value[target, 96.0] = 0.25
    before = clock.now()
    cpu.t += 1.0
    clock.mark(drafter, 8)
    cpu.t += 1.0
    clock.mark(None)
    clock.mark(target, 96)
    cpu.t += 1.0
    clock.mark(None)
    cpu.t += 1.0
    assert clock.now() - before == pytest.approx(0.5 + 0.8 + 0.25 + 0.5)
    before = clock.now()
    cpu.t += 1.0
    assert clock.now() - before == pytest.approx(0.5)  # a reading ends the last mark
    before = clock.now()
    clock.sleep(2.0)  # idle waits are skipped, as on the plain CPU clock
    assert clock.now() - before == pytest.approx(2.0)


def test_the_cpu_clocks_split_their_time_by_what_ran(monkeypatch):
    from specsim.engine.clock import ProcessClock, WallClock

    cpu = FakeCpu()
    monkeypatch.setattr(time, "process_time", cpu)
    target, drafter = object(), object()

    class Normaliser:
        def refresh(self):
            pass

        def current(self, tokens=1.0, model=None):
            return {None: 1.0, target: 0.5, drafter: 2.0}[model]

    plain = {None: 1.0, target: 1.0, drafter: 1.0}
    weighed = {None: 1.0, target: 0.5, drafter: 2.0}
    for clock, scale in ((ProcessClock(), plain), (ReferenceClock(Normaliser()), weighed)):
        start = clock.now()
        cpu.t += 0.001  # the engine's own work
        clock.mark(drafter, 8, "drafter")
        cpu.t += 0.002
        clock.mark(None)
        clock.mark(target, 24, "target")
        cpu.t += 0.004
        clock.mark(None)
        cpu.t += 0.003
        total = clock.now() - start
        expected = {
            "target": 0.004 * scale[target],
            "drafter": 0.002 * scale[drafter],
            "host": 0.004 * scale[None],
        }
        assert clock.split == pytest.approx(expected)
        assert total == pytest.approx(sum(expected.values()))
    assert WallClock().split is None  # GPU passes return before their work is done


def test_the_cpu_clocks_need_a_cpu_and_one_thread(monkeypatch):
    from specsim.models import load_model

    model = load_model("specsim-draft-tiny")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    setting = ReferenceClockSetting(SpeedReference(decode_s=1e-3))
    with pytest.raises(SpecsimError, match="one torch thread"):
        start_clock(setting, "cpu", model)
    with pytest.raises(SpecsimError, match="one torch thread"):
        timing.PassTimer("cpu", clock="reference", normalise=lambda tokens: 1.0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    with pytest.raises(SpecsimError, match="applies to CPU"):
        start_clock(setting, "cuda", model)
    with pytest.raises(SpecsimError, match="unknown clock"):
        start_clock("sundial")
    with pytest.raises(SpecsimError, match="unknown clock"):
        timing.PassTimer("cpu", clock="sundial")
    with pytest.raises(ValueError, match="ReferenceClockSetting"):
        start_clock("reference", "cpu", model)  # the name alone has no references to keep
    clock = start_clock(setting, "cpu", model)
    assert isinstance(clock, ReferenceClock) and clock.normaliser.reference_s == 1e-3


def test_pass_timer_multiplies_each_pass_by_the_factor_read_before_it(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    ticks = iter([0, 4_000_000])  # the pass takes 4 ms of CPU time
    monkeypatch.setattr(time, "process_time_ns", lambda: next(ticks))
    order = []
    timer = timing.PassTimer(
        "cpu",
        clock="reference",
        normalise=lambda tokens, model: order.append((tokens, model)) or 0.5,
    )
    assert timer.time_once(lambda: order.append("run"), 24, "drafter") == pytest.approx(2e-3)
    assert order == [(24, "drafter"), "run"]  # a due probe runs before the pass, never inside
    with pytest.raises(ValueError):
        timing.PassTimer("cpu", clock="reference")
    with pytest.raises(ValueError):
        timing.PassTimer("cpu", clock="cpu", normalise=lambda tokens: 1.0)


def test_reference_pass_times_the_model_and_leaves_its_cache_as_it_found_it():
    from specsim.models import load_model

    model = load_model("specsim-target")
    reference = ReferencePass(model)
    first = reference.median_s(3)
    assert 0 < first < 1.0
    assert int(reference._cache.lengths[0]) == reference.context + 1  # the pass's own token
    reference.median_s(3)
    assert int(reference._cache.lengths[0]) == reference.context + 1  # rolled back each time
    prefill = ReferencePass(model, kind="prefill")
    assert prefill.context == 0 and prefill.tokens == 96
    assert prefill.median_s(3) > first  # 96 tokens cost more than one
    assert int(prefill._cache.lengths[0]) == 96
    with pytest.raises(ValueError):
        ReferencePass(model, kind="sideways")


def test_the_host_pass_times_the_engines_own_work_the_same_each_time():
    from specsim.engine.speed_reference.probes import HostPass

    host = HostPass()
    first = host.median_s(3)
    assert 0 < first < 0.1
    # Its streams move on, but a pass's work does not change with them: the same ops each time.
    assert 0.2 < host.median_s(3) / first < 5
    calls = []
    timed = HostPass(now=lambda: calls.append(1) or 0.0)
    assert timed.median_s(4) == 0.0 and len(calls) == 2 * 5  # a warm-up, then 4 timed passes
