"""The engine overhead: the fit of its terms, the measurement on the real serving iteration, the
grid fitted to the models' positions, and the simulator charging every term."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml
from test_engine_common import hand_profile

from specsim.costs import NO_ROWS, IterationParts
from specsim.errors import SpecsimError
from specsim.profiling.overhead import OverheadPoint, fit_overhead
from specsim.profiling.timing import parse_grid

TRUE = {
    "per_step_s": 7e-4,
    "per_sequence_s": 2e-5,
    "per_draft_step_s": 3e-4,
    "per_draft_token_s": 5e-5,
}


def target_and_tiny():
    """The built-in target and tiny drafter, loaded as a user's models are."""
    torch = pytest.importorskip("torch")
    from specsim.models import load_model

    torch.manual_seed(0)
    return load_model("specsim-target"), load_model("specsim-draft-tiny")


def formula(batch: int, k: int, terms: dict[str, float] = TRUE) -> float:
    return (
        terms["per_step_s"]
        + terms["per_sequence_s"] * batch
        + k * (terms["per_draft_step_s"] + terms["per_draft_token_s"] * batch)
    )


def test_fit_recovers_every_term_from_exact_points():
    points = [OverheadPoint(b, k, formula(b, k)) for b in (1, 4, 8) for k in (0, 2, 4)]
    fit = fit_overhead(points)
    for name, value in TRUE.items():
        assert fit.terms[name] == pytest.approx(value, rel=1e-6), name
    assert fit.max_abs_error_s < 1e-9
    assert fit.predict(3, 5) == pytest.approx(formula(3, 5))


def test_fit_without_drafting_leaves_the_draft_terms_at_zero_and_never_goes_negative():
    target_only = [OverheadPoint(b, 0, formula(b, 0)) for b in (1, 4, 8)]
    fit = fit_overhead(target_only)
    assert fit.terms["per_draft_step_s"] == fit.terms["per_draft_token_s"] == 0.0
    assert fit.terms["per_step_s"] == pytest.approx(TRUE["per_step_s"], rel=1e-6)
    # A per-sequence cost that falls with batch (noise) is clamped at 0, not fitted negative.
    falling = [OverheadPoint(1, 0, 1e-3), OverheadPoint(8, 0, 5e-4)]
    assert fit_overhead(falling).terms["per_sequence_s"] == 0.0
    assert min(fit_overhead(falling).terms.values()) >= 0.0


def hand_costs(tmp_path):
    """Latency fits of round numbers (no overhead): what the engine's iterations are measured
    against in these tests."""
    from specsim.costs import StepCosts
    from specsim.profile import load_profile

    profile = load_profile(hand_profile(tmp_path / "fits.yaml", overhead={"per_step_s": 0.0}))
    return lambda index: StepCosts(profile, None if index is None else "small")


def test_measured_overhead_serves_every_batch_and_window_on_the_real_engine(tmp_path):
    from specsim.profiling.overhead import measure_overhead

    class Progress:  # what a tqdm bar is told
        total, count = None, 0

        def reset(self, total):
            self.total, self.count = total, 0

        def update(self, n):
            self.count += n

    target, drafter = target_and_tiny()
    progress = Progress()
    fit = measure_overhead(
        target,
        [drafter],
        hand_costs(tmp_path),
        batches=(1, 2),
        windows=(0, 2),
        prompt=16,
        output=12,
        waves=2,
        names=["tiny"],
        progress=progress,
    )
    # 2 waves of (target alone at 2 batches + tiny at k = 2 at 2 batches), each one counted.
    assert progress.total == progress.count == 2 * (2 + 2)
    decode = {(p.drafter, p.batch, p.k) for p in fit.points if not p.is_prefill}
    prefill = {(p.drafter, p.batch, p.prompt_tokens) for p in fit.points if p.is_prefill}
    # k = 0 with the target alone, k = 2 with the drafter (k = 0 is not a drafter's window).
    assert {(None, 1, 0), (None, 2, 0), ("tiny", 1, 2), ("tiny", 2, 2)} <= decode
    assert {(None, 1, 16), (None, 2, 32), ("tiny", 1, 16), ("tiny", 2, 32)} <= prefill
    assert all(v >= 0 for v in fit.terms.values())
    assert set(fit.drafters) == {"tiny"}
    # The spread: every iteration of a group over the group's median, pooled.
    assert len(fit.jitter) == 101 and fit.jitter == sorted(fit.jitter)
    assert fit.jitter[0] <= 1.0 <= fit.jitter[-1]


def test_default_grid_fits_the_models_positions_and_given_values_must():
    axes = parse_grid([], "cpu", max_position=256)
    assert max(axes["context"]) + max(axes["new"]) <= 256
    assert max(axes["context"]) == 256 - max(axes["new"])  # still reaches the longest context
    assert max(axes["prefill"]) <= 256
    assert parse_grid([], "cpu") == parse_grid([], "cpu", max_position=100_000)
    with pytest.raises(SpecsimError) as err:
        parse_grid(["context=16,300"], "cpu", max_position=256)
    assert "context" in str(err.value) and "at most 247" in str(err.value)
    with pytest.raises(SpecsimError) as err:
        parse_grid(["new=300"], "cpu", max_position=256)
    assert "new" in str(err.value)


def simulated_tpot(tmp_path) -> float:
    """One request at batch 1, k = 2, every draft accepted: 1 prefill token + 2 steps of 3
    tokens, so its time per output token is a third of one step."""
    from specsim.scenario import load_scenario
    from specsim.simulation.run import run_simulation

    scenario = {
        "name": "overhead-charge",
        "seed": 1,
        "profile": "profile.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 1,
            "requests": 1,
            "prompt": {"dist": "fixed", "value": 16},
            "output": {"dist": "fixed", "value": 7},
        },
        "engine": {"max_batch": 1, "chunked_prefill": False},
        "speculation": {"drafter": "small", "k": 2},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return run_simulation(load_scenario(path)).summary["tpot_s"]["mean"]


def test_simulator_charges_every_overhead_term_at_batch_one(tmp_path, monkeypatch):
    hand_profile(
        tmp_path / "profile.yaml",
        overhead={**TRUE, "source": "measured"},
        per_position=(1.0, 1.0),
    )
    # Target pass over 3 positions, 2 drafter passes of 1 token, overhead at B = 1, k = 2.
    step = (0.01 + 3e-4) + 2 * (0.001 + 1e-5) + formula(1, 2)
    assert simulated_tpot(tmp_path) == pytest.approx(step / 3, rel=1e-9)

    # Planted bug: the draft terms left out of the charge (the formula before them).
    from specsim.costs import formula as cost_formula

    def without_draft_terms(c, sequences, k, drafting):
        return c[cost_formula.OVERHEAD] + c[cost_formula.OVERHEAD + 1] * sequences

    monkeypatch.setattr(cost_formula, "overhead_s", without_draft_terms)
    assert simulated_tpot(tmp_path) != pytest.approx(step / 3, rel=1e-3)


def test_a_drafters_cost_per_speculative_step_is_told_apart_from_its_draft_passes(tmp_path):
    # The target's own steps (k = 0) and the small drafter's (k = 2, 4), which cost 0.8 ms and
    # 0.05 ms per sequence more per step whatever k (the target's pass runs cache-cold).
    extra = {"per_speculative_step_s": 8e-4, "per_speculative_sequence_s": 5e-5}
    small = {**TRUE, "per_draft_step_s": 6e-4, "per_draft_token_s": 1e-4}
    alone = [OverheadPoint(b, 0, formula(b, 0)) for b in (1, 4, 8)]
    speculative = [
        OverheadPoint(
            b,
            k,
            formula(b, k, small)
            + extra["per_speculative_step_s"]
            + extra["per_speculative_sequence_s"] * b,
            "small",
        )
        for b in (1, 4, 8)
        for k in (2, 4)
    ]
    fit = fit_overhead(alone + speculative)
    for name, value in {**extra, "per_draft_step_s": 6e-4, "per_draft_token_s": 1e-4}.items():
        assert fit.drafters["small"][name] == pytest.approx(value, rel=1e-6, abs=1e-12), name
    for name in ("per_step_s", "per_sequence_s"):  # the target's steps alone
        assert fit.terms[name] == pytest.approx(TRUE[name], rel=1e-6), name
    # The simulator charges the step's cost once whatever k, and only when drafting.
    from specsim.costs import StepCosts
    from specsim.profile import load_profile

    path = hand_profile(tmp_path / "p.yaml", overhead={**TRUE, "source": "measured"})
    data = yaml.safe_load(path.read_text())
    data["drafters"]["small"]["overhead"] = fit.drafters["small"]
    path.write_text(yaml.safe_dump(data))
    costs = StepCosts(load_profile(path), "small")
    for batch, k in ((1, 0), (4, 2), (8, 4)):
        expected = formula(batch, k, small) if k else formula(batch, 0)
        if k:
            expected += 8e-4 + 5e-5 * batch
        assert costs.overhead_s(batch, k, batch) == pytest.approx(expected, rel=1e-6)


def test_each_drafter_gets_its_own_draft_terms():
    # The bigger drafter's passes lose more in the loop: its draft terms are twice the other's.
    small = {**TRUE, "per_draft_step_s": 6e-4, "per_draft_token_s": 1e-4}
    points = [
        OverheadPoint(b, k, formula(b, k, terms), name)
        for name, terms in (("small", small), ("tiny", TRUE))
        for b in (1, 4, 8)
        for k in (0, 2, 4)
    ]
    fit = fit_overhead(points)
    for name, terms in (("small", small), ("tiny", TRUE)):
        for term in ("per_draft_step_s", "per_draft_token_s"):
            assert fit.drafters[name][term] == pytest.approx(terms[term], rel=1e-6), (name, term)
    # The shared terms sit between the two; the shared step and sequence terms stay exact.
    assert 3e-4 < fit.terms["per_draft_step_s"] < 6e-4
    assert fit.terms["per_step_s"] == pytest.approx(TRUE["per_step_s"], rel=1e-6)
    assert "small: 0.000 ms per step + 0.000 ms per sequence + k x (0.600 ms" in fit.describe()
    # Unlabelled points (a profile of one anonymous drafter) give no per-drafter terms.
    assert fit_overhead([OverheadPoint(p.batch, p.k, p.seconds) for p in points]).drafters == {}


def test_simulator_charges_a_drafters_own_draft_terms(tmp_path):
    path = hand_profile(
        tmp_path / "profile.yaml", overhead={**TRUE, "source": "measured"}, per_position=(1.0, 1.0)
    )
    shared = simulated_tpot(tmp_path)
    own = {"per_draft_step_s": 9e-4, "per_draft_token_s": 0.0}
    data = yaml.safe_load(path.read_text())
    data["drafters"]["small"]["overhead"] = own
    path.write_text(yaml.safe_dump(data))
    step = (0.01 + 3e-4) + 2 * (0.001 + 1e-5) + formula(1, 2, {**TRUE, **own})
    assert simulated_tpot(tmp_path) == pytest.approx(step / 3, rel=1e-5)  # summary: 6 digits
    assert simulated_tpot(tmp_path) != pytest.approx(shared, rel=1e-3)


PREFILL = {"per_prefill_s": 4e-4, "per_prefill_token_s": 2e-6}


def prefill_seconds(batch: int, prompt: int, prefill=PREFILL) -> float:
    """What a prefill point measures beyond its passes: the decode formula at k = 0 plus the
    prefill terms."""
    return (
        formula(batch, 0)
        + prefill["per_prefill_s"]
        + prefill["per_prefill_token_s"] * (batch * prompt)
    )


def test_fit_recovers_the_prefill_terms_shared_and_per_drafter():
    tiny = {"per_prefill_s": 1e-3, "per_prefill_token_s": 5e-6}
    decode = [OverheadPoint(b, k, formula(b, k), "tiny") for b in (1, 4, 8) for k in (0, 2, 4)]
    prefill = [
        OverheadPoint(b, 0, prefill_seconds(b, n, terms), name, b * n)
        for name, terms in ((None, PREFILL), ("tiny", tiny))
        for b in (1, 4, 8)
        for n in (32, 128)
    ]
    fit = fit_overhead(decode + prefill)
    for name, value in {**TRUE, **PREFILL}.items():
        assert fit.terms[name] == pytest.approx(value, rel=1e-6), name
    for name, value in tiny.items():
        assert fit.drafters["tiny"][name] == pytest.approx(value, rel=1e-6), name
    # The prefill points do not move the decode fit.
    assert fit.max_abs_error_s < 1e-9
    # Without prefill points the prefill terms stay 0 (profiles measured before them).
    assert fit_overhead(decode).terms["per_prefill_s"] == 0.0


def test_decode_and_prefill_iterations_give_spreads_of_their_own():
    wide = (0.8, 0.9, 1.0, 1.1, 1.3)
    narrow = (0.97, 1.0, 1.04)
    decode = [OverheadPoint(b, 2, 1e-3, spread=wide) for b in (1, 4, 8)]
    prefill = [OverheadPoint(b, 0, 2e-3, None, 32 * b, narrow) for b in (1, 2, 4, 8) * 2]
    fit = fit_overhead(decode + prefill)  # 24 prefill iterations: enough for their own
    # Each kind's own spread (scaled to average 1, so compare the ends' ratio).
    assert fit.jitter[-1] / fit.jitter[0] == pytest.approx(1.3 / 0.8, rel=1e-3)
    assert fit.prefill_jitter[-1] / fit.prefill_jitter[0] == pytest.approx(1.04 / 0.97, rel=1e-3)
    described = fit.describe()
    assert "decode iteration time p10..p90 x0.79..x1.28 of its mean" in described
    assert "prefill iteration time p10..p90 x0.97..x1.04 of its mean" in described
    # Fewer than MIN_PREFILL_SPREAD prefill iterations: no spread of their own (the decodes'
    # is used for them).
    assert fit_overhead(decode + prefill[:6]).prefill_jitter == []


def test_the_spread_is_scaled_to_average_one_as_the_simulator_draws_it():
    # Right-skewed ratios (median 1, mean above): the simulator's mean iteration must be the
    # fitted one, so the written multipliers average 1 under linear interpolation.
    from specsim.profile.schema import IterationJitter
    from specsim.profiling.overhead import jitter_quantiles
    from specsim.simulation.jitter import Jitter

    skewed = tuple([0.95] * 40 + [1.0] * 20 + [1.05] * 25 + [1.3] * 15)
    quantiles = jitter_quantiles([OverheadPoint(8, 2, 1e-3, spread=skewed)])
    probs = np.linspace(0, 1, len(quantiles))
    assert np.trapezoid(quantiles, probs) == pytest.approx(1.0, abs=1e-3)
    assert np.interp(0.5, probs, quantiles) < 0.99  # the median sits below the mean
    jitter = Jitter(IterationJitter(quantiles=quantiles, samples=100), np.random.default_rng(0))
    draws = np.array([jitter.factor() for _ in range(200_000)])
    assert draws.mean() == pytest.approx(1.0, abs=2e-3)  # what the simulator charges on average


def test_simulator_charges_the_prefill_terms_on_a_prefill_iteration(tmp_path):
    from specsim.scenario import load_scenario
    from specsim.simulation.run import run_simulation

    path = hand_profile(
        tmp_path / "profile.yaml", overhead={**TRUE, "source": "measured"}, per_position=(1.0, 1.0)
    )
    simulated_tpot(tmp_path)  # writes scenario.yaml: one 16-token prompt at batch 1

    def ttft() -> float:
        return run_simulation(load_scenario(tmp_path / "scenario.yaml")).summary["ttft_s"]["mean"]

    # Target and drafter prompt passes of 16 tokens, the decode formula at B = 1, k = 0.
    bare = (0.01 + 16e-4) + (0.001 + 16e-5) + formula(1, 0)
    assert ttft() == pytest.approx(bare, rel=1e-5)
    data = yaml.safe_load(path.read_text())
    data["overhead"].update(PREFILL)
    path.write_text(yaml.safe_dump(data))
    assert ttft() == pytest.approx(bare + 4e-4 + 16 * 2e-6, rel=1e-5)
    # A drafter's own prefill terms replace the shared ones for a deployment with it.
    data["drafters"]["small"]["overhead"] = {"per_prefill_s": 2e-3}
    path.write_text(yaml.safe_dump(data))
    assert ttft() == pytest.approx(bare + 2e-3, rel=1e-5)


class Log:
    """An engine iteration log with the fields the profiler reads."""

    def __init__(self, rows, drafted=None, target_s=None):
        fields = ("kind", "window", "batch", "new_tokens", "context", "pairs", "dt")
        for i, name in enumerate(fields):
            setattr(self, name, [row[i] for row in rows])
        # Without the target passes' times, a wall-clock run: no split.
        self.target_s = list(target_s or [])
        self.drafter_s = [0.0] * len(self.target_s)
        self.drafted = drafted or []  # per decode iteration, each row's drafts


class Costs:
    """Predicts 1 ms per token fed (decoding rows' or prompt chunks'), all the target pass's."""

    def iteration_parts(self, k, decode, prefill=NO_ROWS):
        return IterationParts(1e-3 * (decode.tokens + prefill.tokens), 0.0, 0.0)


def test_log_points_take_the_median_gap_per_group_and_the_spread_of_its_ratio():
    from specsim.profiling.overhead import log_points

    gaps = (1e-3, 2e-3, 2e-3, 3e-3, 9e-3)
    decodes = [("decode", 2, 4, 12, 400, 0.0, 12e-3 + gap) for gap in gaps]
    ragged = [("decode", 2, 3, 9, 300, 0.0, 20e-3)] * 4  # a wave's tail: too few to fit
    prefills = [("prefill", 0, 4, 64, 0, 0.0, 70e-3), ("prefill", 0, 4, 64, 0, 0.0, 66e-3)]
    points = log_points(Log(decodes + ragged + prefills), Costs(), "tiny")
    decode, prefill = sorted(points, key=lambda p: p.is_prefill)
    assert (decode.batch, decode.k, decode.drafter) == (4, 2, "tiny")
    assert decode.seconds == pytest.approx(2e-3)  # the median gap: not moved by the 9 ms one
    assert len(decode.spread) == 5 and np.median(decode.spread) == pytest.approx(1.0)
    assert max(decode.spread) == pytest.approx(21 / 14)  # 21 ms / 12 ms over the median 14 / 12
    assert (prefill.batch, prefill.prompt_tokens) == (4, 64)
    assert prefill.seconds == pytest.approx(4e-3)
    assert len(points) == 2  # the 4-iteration group at batch 3 is left out
    assert decode.iteration_s == pytest.approx(14e-3)  # the median iteration, for the weights


def test_the_waves_drift_against_the_latency_fits_is_taken_out_of_every_gap():
    # Passes in the waves ran 1.1x what the fits predict (the machine's drift between the two
    # measurements). The target-alone steps' passes show it; a speculative step's gap is then
    # its own work (2 ms), not that plus 10 % of its 12 ms of passes.
    from specsim.profiling.overhead import log_points, wave_pass_scale

    alone_rows = [("decode", 0, 4, 4, 400, 0.0, 4.4e-3 + 1e-3)] * 6
    alone = Log(alone_rows, target_s=[4.4e-3] * 6)
    scale = wave_pass_scale([alone], Costs())
    assert scale == pytest.approx(1.1)
    steps = [("decode", 2, 4, 12, 400, 0.0, 13.2e-3 + 2e-3)] * 5
    (point,) = log_points(Log(steps, target_s=[13.2e-3] * 5), Costs(), "tiny", scale)
    assert point.seconds == pytest.approx(2e-3)
    (alone_point,) = log_points(alone, Costs(), None, scale)
    assert alone_point.seconds == pytest.approx(1e-3)
    (unscaled,) = log_points(Log(steps), Costs(), "tiny")
    assert unscaled.seconds == pytest.approx(3.2e-3)
    # A wave's opening prefill runs cold (80 ms against the fit's 64 here): its gap is the
    # engine's own work alone (3 ms), neither the drift nor the cold start.
    prefills = [("prefill", 0, 4, 64, 0, 0.0, 80e-3 + 3e-3)] * 3
    log = Log(alone_rows + prefills, target_s=[4.4e-3] * 6 + [80e-3] * 3)
    gaps = {p.is_prefill: p.seconds for p in log_points(log, Costs(), None, scale)}
    assert gaps == {False: pytest.approx(1e-3), True: pytest.approx(3e-3)}
    # A wall-clock run keeps no split: nothing is known of the drift.
    assert wave_pass_scale([Log(alone_rows)], Costs()) is None
    assert fit_overhead([point], scale).pass_scale == scale


def test_steps_that_ran_fewer_drafter_passes_than_their_window_are_left_out():
    # Rows near their ends draft fewer than k; when every row does, the step runs fewer
    # drafter passes than the formula charges, and would read as cheap.
    from specsim.profiling.overhead import log_points

    steps = [("decode", 2, 4, 12, 400, 0.0, 14e-3)] * 5 + [("decode", 2, 4, 8, 400, 0.0, 9e-3)] * 4
    drafted = [np.array([2, 1, 2, 0])] * 5 + [np.array([1, 1, 0, 1])] * 4
    (point,) = log_points(Log(steps, drafted), Costs(), "tiny")
    assert point.seconds == pytest.approx(2e-3)  # 14 ms - 12 ms: the short steps left out
    assert len(point.spread) == 5
    (unfiltered,) = log_points(Log(steps), Costs(), "tiny")  # no drafts logged: all count
    assert len(unfiltered.spread) == 9
    too_few = log_points(Log(steps[:3] + steps[5:], drafted[:3] + drafted[5:]), Costs(), "tiny")
    assert too_few == []  # 3 full steps are fewer than a point needs


def test_overhead_errors_are_weighed_against_the_iterations_time():
    # Least squares of the gaps, each relative to its iterations' time (what a latency error
    # is measured against), not to a stand-in for the gap's own size.
    batches = np.array([1, 2, 4, 8])
    gaps = np.array([1.0e-3, 1.6e-3, 1.7e-3, 1.8e-3])  # not a straight line in the batch
    iterations = np.array([4e-3, 5e-3, 7e-3, 11e-3])
    points = [
        OverheadPoint(int(b), 0, float(g), iteration_s=float(t))
        for b, g, t in zip(batches, gaps, iterations, strict=True)
    ]
    design = np.stack([np.ones(4), batches], axis=1) / iterations[:, None]
    expected, *_ = np.linalg.lstsq(design, gaps / iterations, rcond=None)
    assert (expected > 0).all()  # so non-negative least squares finds the same
    terms = fit_overhead(points).terms
    assert [terms["per_step_s"], terms["per_sequence_s"]] == pytest.approx(expected, rel=1e-9)
    # Without the iterations' times, the stand-in weights give another answer.
    stand_in = fit_overhead([OverheadPoint(p.batch, 0, p.seconds) for p in points]).terms
    assert abs(stand_in["per_sequence_s"] - expected[1]) > 0.2 * expected[1]


def test_overhead_points_weigh_by_how_many_iterations_their_median_is_over():
    # The full batches' points (150 iterations each) lie on a line; a wave's ragged end adds
    # points of 5 iterations at the batches in between, 1 ms above it. Weighed alike, they
    # would pull the line up; weighed by sqrt(iterations), the full batches decide it.
    def gap(b):
        return 1e-3 + 0.1e-3 * b

    full = [OverheadPoint(b, 0, gap(b), iteration_s=5e-3, iterations=150) for b in (1, 4, 8)]
    ragged = [
        OverheadPoint(b, 0, gap(b) + 1e-3, iteration_s=5e-3, iterations=5)
        for b in (2, 3, 5, 6, 7)
        for _ in range(4)
    ]
    terms = fit_overhead(full + ragged).terms
    fitted = terms["per_step_s"] + terms["per_sequence_s"] * 1
    # Weights sqrt(150) against sqrt(5): the 20 ragged points move the batch-1 fit by 0.16 ms,
    # where weighed alike they move it by 0.84 ms.
    assert fitted == pytest.approx(gap(1), abs=0.2e-3)
    alike = [replace(p, iterations=1) for p in full + ragged]
    alike_terms = fit_overhead(alike).terms
    assert alike_terms["per_step_s"] + alike_terms["per_sequence_s"] > gap(1) + 0.8e-3


def test_overhead_is_what_the_iterations_take_beyond_the_fits(tmp_path):
    pytest.importorskip("torch")
    from specsim.profiling.overhead import measure_overhead

    class Far:
        def iteration_parts(self, k, decode, prefill=NO_ROWS):
            # Far above any iteration: every point is then clamped to 0.
            return IterationParts(1e3, 0.0, 0.0)

    target, drafter = target_and_tiny()
    fit = measure_overhead(
        target, [drafter], lambda i: Far(), (1,), (2,), prompt=8, output=6, waves=1
    )
    assert fit.points and all(p.seconds < 0 for p in fit.points)
    assert all(v == 0.0 for v in fit.terms.values())


def test_iteration_logs_of_two_runs_join_in_order():
    pytest.importorskip("torch")
    from specsim.engine.engine import IterationLog

    first = IterationLog(dt=[0.01], batch=[2], target_s=[0.005], decode_rows=3, window_rows=6)
    second = IterationLog(dt=[0.02, 0.03], batch=[4, 4], target_s=[0.01, 0.02], decode_rows=8)
    assert first.extend(second) is first
    assert first.dt == [0.01, 0.02, 0.03] and first.batch == [2, 4, 4]
    assert first.target_s == [0.005, 0.01, 0.02]
    assert (first.decode_rows, first.window_rows) == (11, 6)
    assert second.dt == [0.02, 0.03]  # the other log is left as it was
