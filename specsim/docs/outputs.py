"""What each output file holds: described here once; tests/test_docs.py checks the names
against real runs."""

from __future__ import annotations

from specsim.docs.cli import command_names
from specsim.docs.markdown import GENERATED, meanings
from specsim.docs.outputs_engine import engine_section
from specsim.sampling.kinds import LOSSY_VERIFIERS

REQUEST_COLUMNS = {
    "id": "request number, in arrival order",
    "arrival_s": "arrival time (simulated seconds from the start); under "
    "workload.max_concurrency, when the client sent it",
    "scheduled_s": "when the engine first admitted it (queueing = scheduled_s - arrival_s)",
    "first_token_s": "when its first output token was emitted (TTFT = first_token_s - arrival_s)",
    "finish_s": "when its last token was emitted (E2E = finish_s - arrival_s)",
    "prompt_tokens": "prompt length in tokens",
    "output_tokens": "generated tokens",
    "steps": "speculative steps (engine iterations) that emitted tokens for it after prefill",
    "drafted": "draft tokens proposed for it",
    "accepted": "draft tokens accepted (the accepted prefix of each step only)",
    "preemptions": "times it was evicted from the KV cache and recomputed",
    "replica": "replica index that served it",
    "pool": "name of its pool (`main` without pools)",
}

SUMMARY_KEYS = {
    "requests": "requests completed",
    "duration_s": "simulated seconds until the last request finished",
    "throughput_tokens_per_s": "output tokens per second over the run (duration_s: ramp-up and "
    "drain included)",
    "throughput_tokens_per_s_steady": "closed loops: output tokens the fleet emitted per second "
    "within steady_window_s, the figure a load test compares (null for open-loop workloads and "
    "for a closed loop with no steady window)",
    "steady_window_s": "closed loops: [start, end] of the steady window, from the moment every "
    "client's first request has finished to the first time a client is refused a new request "
    "(the request limit or duration_s reached: the drain begins); null where there is none",
    "throughput_requests_per_s": "completed requests per second",
    "prompt_tokens": "prompt tokens processed in all",
    "output_tokens": "output tokens generated in all",
    "ttft_s": "time to first token {mean, p50, p90, p99}",
    "tpot_s": "time per output token after the first {mean, p50, p90, p99} (requests with 2+ "
    "tokens)",
    "e2e_s": "end-to-end latency {mean, p50, p90, p99}",
    "queueing_s": "arrival to first admission {mean, p50, p90, p99}",
    "itl_s": "inter-token latency, the gaps between a request's emissions {mean, p50, p90, p99}",
    "mean_acceptance_length": "1 + accepted / steps with drafts (vLLM's definition; 1 = off)",
    "draft_acceptance_rate": "accepted / drafted, counted causally",
    "per_position_acceptance": "for i = 1..k, the share of steps whose first i drafts were all "
    "accepted (unconditional, as vLLM reports it)",
    "mean_window": "mean k over decoding rows (differs from k under by_batch or adaptive policies)",
    "flops_total": "FLOPs of every forward pass: prefill + verification + drafter",
    "flops_prefill": "FLOPs of prompt processing",
    "flops_verification": "FLOPs of the target's decode/verification passes",
    "flops_drafter": "FLOPs of the drafter's passes",
    "flops_wasted": "FLOPs spent on rejected positions (target verification + drafting)",
    "flops_wasted_fraction": "flops_wasted / flops_total",
    "cost_usd_per_million_tokens": "replicas x the profile's price per hour x duration, per "
    "million output tokens",
    "goodput_requests_per_s": "requests meeting every SLO limit, per second",
    "slo_attainment": "share of requests meeting every SLO limit (1 without an slo)",
    "kv_cache_utilisation": "KV-cache share in use {mean (time-weighted), max}",
    "batch_size": "running sequences per engine iteration {mean, p50, p90, p99, max}",
    "preemptions": "KV-cache evictions in all",
    "engine_iterations": "engine iterations (one target pass each) over all replicas",
    "busy_fraction": "share of replica time spent in iterations",
    "scenario": "what ran: name, profile, drafter, k, verifier, temperature, policy, "
    "acceptance model, workload kind, replicas, router, seed; for a tree (speculation.tree) "
    "also `tree`: its paths, nodes, depth, nodes_per_depth, drafts, source (measured, or "
    "derived from another shape's rates: derived_from) and table_mean_acceptance_length "
    "(the profile table's; drafted and per-position counts are along the accepted path, "
    "depth positions per step)",
    "kv_capacity_tokens": "KV-cache capacity of one replica, in tokens",
    "slo": "the SLO limits applied (null without an slo)",
    "lossy": f"true when a verifier is lossy ({', '.join(sorted(LOSSY_VERIFIERS))})",
    "lossy_note": "why the figures then describe a different sampler (null when exact)",
    "pools": "the same metrics per pool, with the pool's speculation settings",
}

# summary.json's ``disaggregation`` (a fleet with fleet.disaggregation only).
DISAGG_SUMMARY_KEYS = {
    "prefill_replicas": "x: replicas in the prefill pool (its records and metrics: "
    "`pools.prefill`; a request ends there only when its first token is its last)",
    "decode_replicas": "y: replicas in the decode pool (`pools.decode`)",
    "drafter_kind": "the decode pool's drafter kind (null without speculation): "
    "`draft_model` runs its own prompt pass on the decode replica, `heads` receive the "
    "prompt's hidden states with the KV cache, `ngram` needs nothing",
    "link_bandwidth_bytes_per_s": "a transfer's bandwidth: the link's per device pair times "
    "min(prefill TP, decode TP) pairs (times efficiency.interconnect from a hardware file)",
    "link_latency_s": "fixed time per transfer",
    "transfers": "KV-cache transfers (requests that decoded)",
    "transfer_bytes_mean": "bytes per transfer: prompt x target.kv_bytes_per_token, plus "
    "prompt x hidden_size x 2 for heads",
    "transfer_s": "a transfer's time from the prefill's end to the KV cache's arrival, "
    "waiting for the prefill replica's link included {mean, p50, p90, p99} (null without "
    "transfers)",
    "transfer_share_of_ttft": "mean transfer time over mean TTFT (TTFT counts to the decode "
    "replica's first step, which streams the first token)",
    "link_busy_fraction": "share of the prefill replicas' link time spent carrying bytes",
    "busy_fraction": "per pool: share of replica time spent in iterations",
    "kv_cache_utilisation": "per pool: time-weighted mean share of the KV cache in use",
}

# Present only where the scenario sets them (other summaries keep their keys), in the fleet's
# summary and in each pool's.
CACHE_SUMMARY_KEYS = {
    "kv_capacity_blocks": "with engine.block_size: one replica's KV cache in blocks (its tokens "
    "over the block size, rounded down; a split fleet's: a decode replica's, as "
    "kv_capacity_tokens); kv_cache_utilisation then counts blocks",
    "prefix_cache": "with workload.prefix: `hit_rate_tokens` (cached_tokens / queried_tokens, "
    "vLLM's prefix-cache hit rate), `queried_tokens` (the prompt tokens looked up, at every "
    "admission, so a preempted request's recomputation counts again), `cached_tokens` (of "
    "those, hits: whole blocks, at most the prompt less one token) and "
    "`prefill_tokens_computed` (prompt tokens prefill ran). A split fleet's prefill pool "
    "holds the prefix cache; its decode pool looks nothing up (queried 0) and recomputes a "
    "prompt preempted there in full (counted in prefill_tokens_computed)",
}

# Present only with an engine policy that keeps a record (a list: one entry per replica).
POLICY_SUMMARY_KEYS = {
    "window_policy": "per replica, what its engine policy did: `acceptance_gate` (`samples`, "
    "`tripped_at_sample`, `speculation_off_at_s`), `adaptive_steps` (each tier's `steps` at the "
    "end, `changes`, `first_changes` as [time, tier, steps]) or `adaptive_verification` "
    "(`drafts_proposed`, `drafts_verified`, `verified_share`)",
}

BASELINE_KEYS = {
    "baseline": "with --compare-baseline: the same metrics with speculation off (k = 0)",
    "speedup_vs_baseline": "with --compare-baseline: k = 0 latency over speculative latency "
    "(ttft/tpot/e2e mean, p50, p99), throughput ratio and cost ratio (> 1 = speculation better)",
    "compared_vs_baseline": "with --compare-baseline: the metrics compared with the baseline "
    "(TTFT, TPOT and E2E mean, p50, p90, p99; throughput; goodput where there is an slo; cost "
    "per million tokens)",
    "regressions_vs_baseline": "with --compare-baseline: every compared metric that is worse "
    "with speculation by 0.5 % or more, the largest first: metric, label, value, baseline and "
    "worse_by (the relative change in the bad direction: 0.3 = 30 % worse); [] when none is",
}

WINDOW_SUMMARY_KEYS = {
    "command": "`plan window`",
    "scenario": "the scenario file",
    "drafter": "the scenario's drafter",
    "verifier": "the scenario's verifier",
    "load_axis": "`rate`, `concurrency` or `speed`: what a load level sets",
    "chosen_by": "the rule that picks the best k (goodput under the SLO, or mean E2E latency)",
    "k_values": "the window sizes swept",
    "best_k": "per load: the best static k, its E2E speed-up over k = 0, mean batch, goodput, "
    "and the adaptive policy's and the best static k's mean E2E latency",
    "crossover_load": "the lowest load from which k = 0 (no drafter) is best at it and every "
    "higher load swept (null: not within the loads swept)",
    "last_load_where_speculation_pays": "the highest load below the crossover where a k > 0 won",
    "regressions_vs_k0": "every compared metric (TTFT, TPOT and E2E mean/p50/p90/p99, "
    "throughput, goodput, cost) that is worse at the best k than with speculation off, at the "
    "loads where a k > 0 is chosen: `{metric, label, by_load: [{load, worse_by}], loads_worse, "
    "loads_compared, worse_by: {min, median, max}}` (worse_by 0.3: 30 % worse); empty when none",
    "policies": "per load, the window policies judged as k is: `{load, best_static_k, figures: "
    "{static, by_batch, adaptive, and with --policies adaptive_steps, adaptive_verification}, "
    "winner, margin (its lead "
    "over the best other policy, a fraction), tied_with (policies within the plan's tie band: "
    "the simplest wins), winner_beats_off}`; a policy whose run is missing is left out",
    "k_by_batch": "the k-by-batch-size table and its verdict (keys below)",
    "simulations": "printed with --json only (it varies between reruns, the file must not): "
    "{computed, cached}, simulations run now and reused from `points/`",
    "failed": "simulations that failed: their overrides and error",
    "screening": "only when the grid was screened (`--screen`, or more than 200 points without "
    "`--exhaustive`): `configurations`, `estimated`, `estimate_failures`, `simulated`, "
    "`pruned`, `margin` (`e2e_log_ratio`, `goodput_met_log_ratio`: how far an estimated ratio "
    "of two points may be from the simulated one) and `pruned_configurations` "
    "(`[{group, config, beaten_by, reason}]`: the load, the k not simulated, the simulated k "
    "it cannot beat and why)",
}

K_BY_BATCH_KEYS = {
    "rows": "the table in specsim's form, `[{max_batch, k}]` covering batch sizes 1..max_batch "
    "(empty when there is no table to offer): per running batch size, the k whose decode step "
    "emits the most expected tokens per second with the drafter deployed",
    "num_speculative_tokens_per_batch_size": "the same table as vLLM's ranges "
    "`[first batch size, last batch size, k]`",
    "context_tokens_per_sequence": "the context per running sequence the table was derived at "
    "(the mean over the best static runs where speculation pays; null when it pays at none)",
    "verdict": "`recommended` when the table's own simulation matches or beats the best static "
    "k at every judged load, else `not recommended`",
    "reason": "the verdict's reason in words (the load and figures it loses at, if any)",
    "speculation_off_above_load": "the highest load where speculation still pays when k = 0 "
    "(no drafter) is best at every load above it: turn speculation off above it, where the "
    "table is not judged (null when speculation pays at the highest load swept, or at none)",
    "per_load": "per load: `load`, `offered_rps`, `judged` (false from the crossover on), "
    "`outcome` (`better`, `equal`, `worse` or `failed`: the table against the best static k, "
    "null without a table or a static result; "
    "goodput within 1 % of the served rate and mean E2E within 2 % counting as equal), "
    "`table` and `best_static` (`k` and the figures: goodput, SLO attainment, throughput, E2E "
    "mean and p99, TTFT p99, TPOT p99)",
}

REPORT_FILES = {
    "report.html": "the report, self-contained (figures inlined; opens with no network)",
    "report.md": "the same report as Markdown, next to its PNG figures",
    "summary.json": "the command's --json summary: the answer in machine-readable form",
    "sweep.json": "every simulation of the sweep: its settings and its summary",
    "*.png": "the report's figures",
    "*.csv": "every number in each figure and table, one CSV per figure or table; a figure's "
    "is long format, `panel,series,x,y,x_unit,y_unit`, each number in the unit it is drawn in "
    "(TTFT and TPOT in ms, E2E in s, wasted FLOPs in %), a table's columns name their units",
    "points/": "one JSON per simulation (its settings, summary and `cpu_s`, the CPU seconds it "
    "took: measured, so the one value that differs between reruns): a rerun with the same --out "
    "reuses them",
}

COMMAND_OUTPUTS = {
    "specsim plan window": {
        **REPORT_FILES,
        "best_k.csv": "best static k per load, with the adaptive and k-by-batch results",
        "k_by_batch.yaml": "the derived k-by-batch-size table as a scenario `speculation` "
        "section and as vLLM `num_speculative_tokens_per_batch_size`, its verdict on top",
        "k_by_batch_check.csv": "per load: the table's own simulation against the best static k",
        "sweep.csv": "one row per simulation (load x k, adaptive, by_batch)",
    },
    "specsim plan capacity": {
        **REPORT_FILES,
        "summary.json": "the command's --json summary: the answer in machine-readable form. "
        "Candidates rank by fleet cost, at equal cost speculation off first; "
        "`recommendation.tie_on_cost` names the speculative candidates such a tie passed over "
        "and why (null: none), and `fleet_checked_too` the candidates whose fleet was checked "
        "because a cheaper plan's check needed more replicas. "
        "With --disaggregated: `target_rps`, `attainment`, `tolerance`, `max_replicas`, "
        "`searches` (per speculation setting and kind, co-located or disaggregated: `chosen`, "
        "`layouts_tried`, `reasons`, and `capacity`: `capacity_rps`, the highest rate the "
        "choice sustained, `bracket_rps`, `status`, `error`, `probes`, the simulations the "
        "bisection ran above the target, and `headroom`, capacity over the target less 1), "
        "`comparison`, `candidates` (candidates.csv's rows), `pareto` (pareto.csv's points), "
        "`failed`, and with the deployment options `deployments` and `not_fitting`",
        "policies.csv": "with --policies: per drafter and window policy (the best static k, "
        "the k-by-batch table, the goodput policy, the engines' policies named) its best "
        "candidate, capacity, the replicas and cost the target needs, speculation off's "
        "replicas, whether it needs more, and the winner (fewest replicas, then cost, then the "
        "simpler policy); summary.json's `policies`: per traffic level (the target), "
        "`{target_rps, by_policy: [{drafter, policy, candidate, capacity_rps, replicas, "
        "cost_usd_per_hour, replicas_without_speculation, more_replicas_than_off}], winner: "
        "{drafter, policy, candidate}, margin_replicas (fewer than the next), margin (capacity "
        "per device over the next's, less 1), tied_with, winner_beats_off, no_table (drafters "
        "without a table, and why)}`. The recommendation stays among the plan's own candidates; "
        "`--emit` writes the best policy an engine runs (not the goodput policy) where it is "
        "not the static k and needs fewer replicas than speculation off",
        "capacity.csv": "per candidate (k = 0, each drafter x k, adaptive): the highest rate "
        "one replica sustains within the SLO, replicas and cost for the target rate",
        "fleet.csv": "the fleet simulation at the target rate that confirms the choice",
        "fleet_vs_off.csv": "the chosen fleet against speculation off on the replicas its "
        "capacity calls for, at the target rate: every compared metric, which is worse and by "
        "how much (absent when the choice is speculation off)",
        "layouts.csv": "with --disaggregated (in place of the files above, beside "
        "summary.json): every layout simulated (setting, co-located n or xPyD, the "
        "deployments it runs on, devices, price per hour, whether it meets the SLO, "
        "attainment, TTFT and TPOT p90, throughput, cost per million tokens, the transfer's "
        "share of TTFT, each pool's and the links' busy fraction)",
        "candidates.csv": "with --disaggregated: one row per search and deployment (or "
        "prefill + decode pair), co-located and disaggregated in one table: chosen, lost on "
        "cost, missed the SLO (with the bottleneck pool) or not reached (its cheapest layout "
        "costs more than the choice), and why",
        "pareto.csv": "every probe within the SLO as a point of per-user speed (output "
        "tokens/s, 1 / the median TPOT) against output tokens/s per device, and whether it is on "
        "the Pareto frontier (no other point is at least as good on both and better on one); "
        "summary.json's `pareto` lists the same points. Written by the deployment search (--tp, "
        "--precision, --profile: each candidate's probes) and by --disaggregated: every layout "
        "simulated at the target rate that met the SLO, co-located and xPyD, with speculation "
        "and without, on every deployment, as one frontier (setting, kind, layout, placement: "
        "the deployment or pair, null for the scenario's own replicas, each pool's replicas, "
        "devices: each pool's replicas x TP, throughput, tokens/s per user and per device, "
        "on_frontier)",
        "pareto_frontier.png": "the points of pareto.csv and the frontier through them: one "
        "series per deployment, with --disaggregated one per kind (co-located, "
        "disaggregated) and speculation setting",
        "report.html": REPORT_FILES["report.html"] + "; with --disaggregated: each search's "
        "choice and its reasons (the bottleneck pool, one replica fewer in each pool, the "
        "transfer's share of TTFT, the capacity bisected to --tolerance), co-located against "
        "disaggregated per speculation setting, the deployments that do not fit and the "
        "frontier plot",
    },
    "specsim report drafter-swap": {
        **REPORT_FILES,
        "drafters.csv": "the drafters side by side (medians over the loads, each at its best k)",
        "per_load.csv": "each load: every drafter at its best k, and the winner",
        "policies.csv": "with --policies: each load, every chain drafter with each window "
        "policy (its best static k above 0, and those named), each drafter's k = 0, the "
        "winning pair, its margin, the pairs tied with it, whether it beats k = 0 and the "
        "pairs that lose to k = 0; summary.json's `policies`: per load `{load, static_k, "
        "figures: {drafter: {policy: figure}}, speculation_off: {drafter: figure}, winner: "
        "{drafter, policy}, margin, tied_with, winner_beats_off, lose_to_off}`, judged as `plan "
        "window` judges its policies (a pair loses beyond the tie band)",
        "sweep.csv": "one row per simulation (drafter x load x k)",
    },
    "specsim validate": {
        "engine/": "the real engine's run: requests.csv (the columns above, plus "
        "target_logprob_mean and eos), summary.json (the same keys as a simulation, "
        "without the steady-state throughput, a tree run's scenario.tree with nodes_verified "
        "(nodes verified over all steps: every row verifies the whole tree) instead of the "
        "simulation's source and table entries, plus machine_speed with --clock reference: "
        "the probes' slowdowns, the target's and each drafter's) and iterations.csv (one row "
        "per iteration: kind, window, batch, the target pass's new_tokens, context and pairs "
        "as the padded batch runs them (every row to the longest row's context; a prefill, "
        "every prompt at the longest one's length; a tree step, the root and every node of "
        "each row), seconds (from the end of the previous iteration, its bookkeeping "
        "included, so busy iterations add up to the busy time), and with --clock cpu or "
        "reference target_s and drafter_s, the part of seconds in each model's passes) and "
        "vllm-bench.json (the same run as `vllm bench serve --save-result --save-detailed "
        "--metric-percentiles 50,90,99` writes its own, its `produced_by` key saying that "
        "specsim's engine wrote it: what profile from-bench and validate --bench read)",
        "simulation/": "the simulator's first run of the same workload: requests.csv, summary.json",
        "comparison.json": "each metric: measured (engine), predicted (the median over "
        "--replications simulator runs of the same requests), relative error, threshold, ok, "
        "band (their p10..p90), draws_below and draws (how many of them lie below the measured "
        "value, of how many) and first_draw (simulation/'s value); profile_fit (each latency "
        "fit's held-out error, median and max, the limit on the median (10 %) and the models "
        "flagged beyond it); iteration_residuals (per kind, k and batch: the measured and "
        "predicted mean and median ms, ratio and gap of the means, the measured p10..p90; the "
        "prediction is the cost model times the profile's iteration-time spread, as the "
        "simulator charges it); machine_speed. With --bench: scenario, profile, bench (the "
        "folder), passed (every run within every threshold) and runs: per run name, file, run "
        "(its number in the file), label, format, engine, engine_version, model, traffic "
        "(request_rate, burstiness, max_concurrency, completed), workload (as replayed: "
        "requests, arrivals, max_concurrency, lengths, engine, seed), speculation (k, "
        "scalar_only; null: off), passed and rows (as above, one per figure the file holds and "
        "the simulation gives, as the benchmark client measures it, and mean_acceptance_length "
        "against the run's counters), not_compared (figure: why) and notes (the reader's)",
        "comparison.md": "the same comparison as a table, a warning for a flagged profile fit, "
        "each iteration group's measured against predicted time (mean against mean, median "
        "against median), and with the CPU clocks the mean time split into the target pass, "
        "the drafter passes and the engine's own work; with --bench, a table per run",
        "validation.png": "engine against simulation, figure; with --bench, a row per run: "
        "the relative errors, and the simulator's E2E and TPOT distributions with the run's "
        "measured percentiles marked",
        "validation.csv": "every number in validation.png, long format "
        "(`panel,series,x,y,x_unit,y_unit`): each metric's relative error and threshold in %, "
        "and each distribution's points (E2E in s, TPOT in ms, against the share of requests)",
        "profile.yaml": "the profile measured on this machine (without --profile)",
        "runs/": "with --bench, in place of engine/ and simulation/: one folder NN-LABEL per "
        "benchmark run (its number in file order, and its label or its file's stem) holding "
        "workload.csv (the run's workload as replayed: send times and lengths, Vidur layout), "
        "and the simulator's seeded run of it (requests.csv, summary.json)",
    },
    "specsim profile": {
        "FILE.yaml": "the profile (schema: [profile.md](profile.md)); with measure --sequences, "
        "the per-request acceptance sequences beside it",
        "FILE.calibration.json": "from-bench: prior (path, source); method (the residuals' "
        "weighting, the prior's spread, the threshold below which a term is determined, the "
        "simulations run); terms (each fitted term: kind, value, prior, determined, "
        "spread_ratio, description) and correlation (their posterior correlations, in that "
        "order); fit and held_out (figures, median_abs_error, max_abs_error of simulated / "
        "measured - 1; held_out null with one run or --no-held-out); acceptance (per drafter: "
        "per_position, mean_acceptance_length, where each window came from: counters or a "
        "scalar, the windows filled from the chain, from_scalar and the rule used, "
        "kept_from_prior); runs (per run: file, run, label, engine, model, traffic, the "
        "workload as replayed: requests, arrivals, max_concurrency, lengths, engine, seed; "
        "speculation; metrics: per figure measured, prior (the prior's prediction), fitted, "
        "error, held_out, held_out_error, or not_fitted with the reason; the reader's notes); "
        "checked (--check-runs: their errors per run and figure, fitted and prior); "
        "engine_caps (max_batch, max_batched_tokens: value, source); engine_request_cost "
        "(whether the cost per admitted request was fitted, and why); gate (basis, errors "
        "against the prior's, threshold, passed, worst_figure, accepted_with); notes",
    },
    "specsim check rollout": {"rollout.json": "with --out: the tests and the verdict"},
}


def outputs_page() -> str:
    available = command_names()
    parts = [
        "# Output files",
        GENERATED,
        "Every command writes into `--out DIR` atomically: the files appear only once the "
        "whole run succeeded. Times are simulated seconds; latency statistics `{mean, p50, p90, "
        "p99}` follow vLLM's definitions (see docs/guide/concepts.md).",
        "## `specsim simulate`: `requests.csv`",
        "One row per completed request, by request id (the order of arrival); standard CSV: a "
        "cell holding a comma or a quote (a pool name) is quoted.",
        meanings(REQUEST_COLUMNS, "column"),
        "## `specsim simulate`: `summary.json`",
        meanings({**SUMMARY_KEYS, **BASELINE_KEYS}),
        "Where the scenario sets them, after `kv_capacity_tokens` (and in each pool's summary):",
        meanings(CACHE_SUMMARY_KEYS),
        "With an engine policy that keeps a record (before `scenario`):",
        meanings(POLICY_SUMMARY_KEYS),
        "### `summary.json`: `disaggregation`",
        "A disaggregated fleet (`fleet.disaggregation`) adds `disaggregation` after `pools`: "
        "the pools' sizes and use, and the KV transfers.",
        meanings(DISAGG_SUMMARY_KEYS),
    ]
    for command, files in COMMAND_OUTPUTS.items():
        if command not in available:  # a command not wired into the CLI (yet) is not documented
            continue
        parts.append(f"## `{command}`")
        parts.append(meanings(files, "file", "what it holds"))
        if command == "specsim plan window":
            parts.append("### `summary.json`")
            by_batch = {f"k_by_batch.{k}": v for k, v in K_BY_BATCH_KEYS.items()}
            parts.append(meanings({**WINDOW_SUMMARY_KEYS, **by_batch}))
        if command == "specsim report drafter-swap":
            parts += engine_section()
    return "\n\n".join(parts) + "\n"
