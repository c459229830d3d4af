"""Disaggregated prefill and decode (xPyD): a prefill pool computes prompts, a decode pool
decodes them, and each prompt's KV cache crosses a link between the two.

- A prefill replica runs the engine's own prefill iterations (chunked within the token budget
  when the engine chunks, whole prompts otherwise) with speculation off, and samples the first
  token, as the prefill workers of vLLM's and SGLang's disaggregated serving do. Its KV blocks
  are released when the prefill ends (the transfer reads them meanwhile).
- Prefix caching (``workload.prefix``) lives on the prefill pool, with the co-located hit rules
  (``specsim.simulation.admission``): cached tokens skip its prefill compute. A session's turn
  hits on the prefill replica that computed the previous turn's prompt, which it remembers
  (the prompt alone: the output's KV was made on a decode replica); ``fleet.router`` spreads
  arrivals over the prefill pool, so ``cache_aware`` gives sessions their affinity there.
- The handover moves ``transfer_bytes``: the whole prompt's KV cache, its cached prefix too
  (the decode replica keeps no prefix cache here, so it has no copy; vLLM's NIXL and Mooncake
  connectors would load only what the decode instance's own cache lacks), at the profile's
  ``kv_bytes_per_token`` (every shard; the figure the roofline and the KV-capacity model use),
  plus what the decode side's drafter needs, by drafter kind:
  * ``draft_model``: nothing more; the decode replica runs the draft model's own prompt pass
    (its profile's prefill cost, charged in the iteration the request joins);
  * ``heads`` (EAGLE, MTP, Medusa): the target's last hidden state for every prompt token,
    ``hidden_size`` x 2 bytes (16-bit activations) per token, the features the heads draft from
    (a cached prefix's too: the prefill pool is taken to keep them with its cached blocks);
  * ``ngram``: nothing (prompt lookup reads the prompt's tokens, which travel with the request).
- Transfer time = bytes / (link bandwidth x device pairs) + latency, where each of
  min(prefill TP, decode TP) device pairs moves its shard at once; one prefill replica's
  transfers queue on its link, first come first served.
- A decode replica admits a request whose KV cache has arrived straight into its decoding batch
  (FCFS with its queue, within the batch's room and its KV cache, which then holds the prompt
  plus the lookahead slots: k + 1, and with ``engine.block_size`` a draft model's k more, in
  whole blocks as co-located rows) and streams the first token with its first decode step's
  output: TTFT = queueing + prefill + transfer + (a wait for room) + that first decode
  iteration. A request preempted on the decode side recomputes its whole prompt there.
- On the fast path both pools run the compiled serving kernel behind their routers
  (``fleet_serving.py``): a prefill replica's call stops after an iteration that hands a
  prompt off (``compiled_layout.HANDS_OFF``), and a decode replica's joins, first tokens and
  owed prompt passes are kernel rules too (``JOINS``, ``PROMPT_PASS``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.hardware import load_hardware
from specsim.metrics import exact_summary
from specsim.profile.kinds import reads_hidden_states
from specsim.simulation.admission import Admission
from specsim.simulation.compiled_layout import HANDED_OFF
from specsim.simulation.fleet import Fleet
from specsim.simulation.plans import Plan
from specsim.simulation.replica import Replica
from specsim.simulation.request import Request

HIDDEN_STATE_BYTES = 2  # the target's hidden states travel in 16 bits, whatever its weights


def transfer_bytes(target, hidden_states: bool, prompt: int) -> float:
    """Bytes one prompt's handover moves: the target's KV cache, and its hidden states for a
    drafter that reads them (``kinds.reads_hidden_states``)."""
    moved = float(prompt) * target.kv_bytes_per_token
    if hidden_states:
        moved += float(prompt) * target.hidden_size * HIDDEN_STATE_BYTES
    return moved


def check_transfer_sizes(target, hidden_states: bool, path) -> None:
    """The profile must give what the handover's bytes are made of."""
    if target.kv_bytes_per_token <= 0:
        raise SpecsimError(
            "the profile has no target.kv_bytes_per_token, so a KV transfer's size is unknown",
            file=str(path),
            key="target.kv_bytes_per_token",
            fix="add it to the profile (2 x layers x kv_heads x head_dim x bytes per value)",
        )
    if hidden_states and target.hidden_size <= 0:
        raise SpecsimError(
            "the decode pool's drafter needs the prompt's hidden states, but the "
            "profile has no target.hidden_size",
            file=str(path),
            key="target.hidden_size",
            fix="add it to the profile, or draft with another kind of drafter",
        )


class KvLink:
    """The prefill replicas' links to the decode pool: one FIFO link per prefill replica."""

    def __init__(self, bandwidth_bytes_per_s: float, latency_s: float, pairs: int, senders: int):
        self.bandwidth = bandwidth_bytes_per_s * pairs  # device pairs move their shards at once
        self.latency = latency_s
        self.free_at = [0.0] * senders

    def send(self, sender: int, now: float, nbytes: float) -> float:
        """The time the bytes have arrived (after earlier transfers on the sender's link)."""
        start = max(now, self.free_at[sender])
        done = start + nbytes / self.bandwidth
        self.free_at[sender] = done
        return done + self.latency


class PrefillAdmission(Admission):
    """A prefill replica holds a prompt only until its first token: only the prompt must fit."""

    def output_held(self, request: Request) -> int:
        return 0


class DecodeAdmission(Admission):
    """FCFS admission where a request whose KV cache has arrived joins the batch without a
    prefill (``join``); one preempted here recomputes its whole prompt (this pool keeps no
    prefix cache: it looks nothing up)."""

    def __init__(self, *args, join):
        super().__init__(*args)
        self._joined = join

    def joins(self, request: Request) -> bool:
        return request.prefilled > 0  # preemption sets it back to 0

    def join(self, request: Request) -> None:
        request.level = self._next_level(request)  # this pool's acceptance levels
        self._joined(request)

    def _cached(self, request: Request, used: float) -> int:
        return 0


class PrefillReplica(Replica):
    """Prefill only: a request whose prompt is through leaves for the decode pool
    (``hand_off``) unless its first token was its last. Its prefix cache (``prefix``)
    remembers the prompts it computed."""

    hands_off = True  # the serving kernel hands them off too (``compiled_layout.HANDS_OFF``)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        engine, old = args[2], self.admission
        self.admission = PrefillAdmission(
            engine, self.kv_lookahead, self.kv_capacity, self.acceptance, old.rng, old.prefix
        )
        self.to_decode = None  # set by the fleet: (replica, request, now)

    def _finish_prefills(self, chunks, now: float) -> None:
        for request in self.admission.complete(chunks, now):
            if request.generated >= request.output:
                self._finish(request, now)
            else:
                self.hand_off(request, now)

    def hand_off(self, request: Request, now: float) -> None:
        """The request's prompt is through: it leaves (its blocks stay cached once sent) for a
        decode replica, which streams its first token."""
        self.outstanding -= 1
        self.admission.finished(request)
        request.first_token = HANDED_OFF
        self.to_decode(self, request, now)


class DecodeReplica(Replica):
    """Decode with speculation; requests arrive with their KV cache (``receive``)."""

    joins = True  # the serving kernel joins them too (``compiled_layout.JOINS``)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        engine, old = args[2], self.admission
        self.admission = DecodeAdmission(
            engine, self.kv_lookahead, self.kv_capacity, self.acceptance, old.rng, join=self._join
        )
        self.prompt_pass = [0, 0.0, 0.0]  # the draft model's prompt passes owed

    def expect(self) -> None:
        """A transfer to this replica has begun (the router counts it as outstanding)."""
        self.outstanding += 1

    def _join(self, request: Request) -> None:
        self._start_decoding(request)
        if self.draft_prompt_pass:
            owed, prompt = self.prompt_pass, float(request.prompt)
            owed[0] += 1
            owed[1] += prompt
            owed[2] += prompt * (prompt + 1) / 2.0

    def _plan_mixed(self) -> Plan:
        plan = super()._plan_mixed()
        rows, tokens, pairs = self.prompt_pass
        if rows:
            costs = self.costs
            plan.seconds += costs.draft_prefill_s(rows, tokens, 0.0, pairs)
            self.stats.flops["prefill"] += costs.draft_prefill_flops(tokens, pairs)
            self.prompt_pass = [0, 0.0, 0.0]
        return plan

    def _apply_mixed(self, plan: Plan, now: float, start: float) -> None:
        # The rows that joined since the last decode iteration and are still decoding (not
        # preempted) have no first token yet: it comes with this iteration's output.
        if plan.decode is not None and plan.decode.joined:
            for request in self.slot_request[: self.high]:
                if request is not None and request.first_token < 0:
                    request.first_token = now
        super()._apply_mixed(plan, now, start)


REPLICA_CLASSES = {"prefill": PrefillReplica, "decode": DecodeReplica}


class DisaggregatedFleet:
    """Arrivals go to the prefill pool (``fleet.router``); a finished prefill picks a decode
    replica (``decode_router``) and its KV cache crosses the link."""

    def __init__(self, env, replicas: list[Replica], split, link: KvLink, rngs, setups):
        self.env = env
        self.replicas = replicas
        prefill = [r for r in replicas if isinstance(r, PrefillReplica)]
        decode = [r for r in replicas if isinstance(r, DecodeReplica)]
        self.prefill = Fleet(prefill, *rngs[0])  # (router, rng, balance_abs_threshold)
        self.decode = Fleet(decode, *rngs[1])
        self.link = link
        prefill_setup, decode_setup = setups
        self.target = prefill_setup.costs.profile.profile.target
        drafter = decode_drafter(decode_setup)
        self.drafter_kind = None if drafter is None else drafter.kind
        self.hidden_states = drafter is not None and reads_hidden_states(
            drafter.kind, drafter.method
        )
        check_transfer_sizes(self.target, self.hidden_states, prefill_setup.costs.profile.path)
        self._sender = {id(r): i for i, r in enumerate(prefill)}
        for replica in prefill:
            replica.to_decode = self.handoff
        for replica in decode:
            # A drafter with a cache of its own builds it over the prompt on the decode side.
            passes = decode_setup.costs.drafter.passes
            replica.draft_prompt_pass = passes is not None and passes.own_cache
        self.transfer_s: list[float] = []
        self.transfer_bytes = 0.0

    def dispatch(self, request: Request) -> None:
        self.decode.replicas[0].admission.check_fits(request)  # the decode side holds it all
        self.prefill.dispatch(request)

    def handoff(self, replica: PrefillReplica, request: Request, now: float) -> None:
        target = self.decode.choose()
        target.expect()
        nbytes = transfer_bytes(self.target, self.hidden_states, request.prompt)
        arrival = self.link.send(self._sender[id(replica)], now, nbytes)
        self.transfer_s.append(arrival - now)
        self.transfer_bytes += nbytes
        self.env.timeout(arrival - now).callbacks.append(lambda _event: target.receive(request))

    def summary(self, fleet: dict[str, Any]) -> dict[str, Any]:
        """summary.json's ``disaggregation``: the pools' sizes and use, and the transfers
        (``fleet``: the rest of the summary)."""
        pools, duration = fleet["pools"], fleet["duration_s"]
        ttft_mean = fleet["ttft_s"]["mean"]
        times = np.asarray(self.transfer_s, dtype=np.float64)
        mean = float(times.mean()) if times.size else 0.0
        link_s = self.transfer_bytes / self.link.bandwidth  # seconds the links carried bytes
        return {
            "prefill_replicas": len(self.prefill.replicas),
            "decode_replicas": len(self.decode.replicas),
            "drafter_kind": self.drafter_kind,
            "link_bandwidth_bytes_per_s": self.link.bandwidth,
            "link_latency_s": self.link.latency,
            "transfers": int(times.size),
            "transfer_bytes_mean": self.transfer_bytes / times.size if times.size else 0.0,
            "transfer_s": exact_summary(times) if times.size else None,
            "transfer_share_of_ttft": mean / ttft_mean if ttft_mean else 0.0,
            "link_busy_fraction": link_s / (len(self.prefill.replicas) * duration)
            if duration
            else 0.0,
            "busy_fraction": {name: pool["busy_fraction"] for name, pool in pools.items()},
            "kv_cache_utilisation": {
                name: pool["kv_cache_utilisation"]["mean"] for name, pool in pools.items()
            },
        }


def decode_drafter(setup):
    """The decode pool's drafter spec (None with speculation off)."""
    spec = setup.speculation
    if not spec.enabled:
        return None
    return setup.costs.profile.drafter(spec.drafter)


def kv_link(scenario, split, prefill_devices: int, decode_devices: int) -> KvLink:
    """The link the scenario's ``kv_transfer`` describes, between the two pools."""
    transfer = split.kv_transfer
    pairs = min(prefill_devices, decode_devices)
    senders = split.prefill.replicas
    if transfer.hardware is None:
        return KvLink(transfer.bandwidth_bytes_per_s, transfer.latency_s, pairs, senders)
    path = scenario.resolve(transfer.hardware)
    hardware = load_hardware(path)
    link = getattr(hardware, transfer.link)
    if link is None:
        raise SpecsimError(
            f"the hardware file has no {transfer.link!r} section",
            file=str(path),
            key=transfer.link,
            fix="name a link the file describes (nvlink, pcie) or give "
            "kv_transfer.bandwidth_bytes_per_s and latency_s",
        )
    bandwidth = link.bandwidth_bytes_per_s * hardware.efficiency.interconnect
    return KvLink(bandwidth, link.latency_s, pairs, senders)
