"""`--emit`'s engine files and summary keys (plan window, plan capacity, report
drafter-swap): the output page's engine section."""

from __future__ import annotations

from specsim.docs.markdown import meanings

# Written by specsim.planning.emit.emit.
ENGINE_FILES = {
    "engine/vllm.json": "vLLM's `--speculative-config` value, exactly: one JSON object (no "
    'comments: JSON has none), so `--speculative-config "$(cat vllm.json)"` passes it; absent '
    "when the recommendation is speculation off",
    "engine/vllm.args": "the whole `vllm serve` argument list after the model: a comment header "
    "(specsim version, scenario, profile, the recommendation, the model paths and where they "
    "came from, what vLLM cannot express and what stands in for it, how to start the server), "
    "then one option per line, values shell-quoted (`--max-num-seqs`, "
    "`--max-num-batched-tokens`, `--tensor-parallel-size` (the profile's devices per replica; "
    "the draft model's in the JSON's `draft_tensor_parallel_size`), `--quantization fp8` and "
    "`--kv-cache-dtype fp8` for a profile in FP8, `--speculative-config` with the same "
    "JSON): `shlex.split(text, comments=True)` reads the list, and so does the header's "
    "`eval \"vllm serve MODEL $(grep -v '^#' vllm.args | tr '\\n' ' ')\"`",
    "engine/sglang.args": "SGLang's `launch_server` options in the same layout: "
    "`--speculative-algorithm`, `--speculative-draft-model-path`, `--speculative-num-steps`, "
    "`--speculative-eagle-topk` 1, `--speculative-num-draft-tokens` steps + 1 (prompt lookup: "
    "NGRAM with `--speculative-ngram-max-bfs-breadth` 1), `--max-running-requests`, `--tp-size`, "
    "`--page-size` for the scenario's `engine.block_size` (the radix cache is left on, SGLang's "
    "default), `--speculative-adaptive` with `--speculative-adaptive-config` for policy "
    "`adaptive_steps`",
    "engine/sglang-adaptive.json": "SGLang's adaptive-steps config (policy `adaptive_steps` on "
    "an EAGLE/EAGLE3 chain): the global constants and one entry per batch-size tier with its "
    "`candidate_steps`, as `--speculative-adaptive-config` reads it",
    "engine/trtllm.yaml": "TensorRT-LLM's `--extra_llm_api_options` YAML under the same header: "
    "`max_batch_size`, `max_num_tokens`, `tensor_parallel_size` and `speculative_config` "
    "(`decoding_type`, `max_draft_len`, `speculative_model`, `draft_len_schedule` for a "
    "k-by-batch table, `max_concurrency` for a static k's cut-off, `acceptance_rate_threshold` "
    "and `acceptance_rate_window_size` for the acceptance off-switch, "
    "`max_matching_ngram_size` for prompt lookup), and `kv_cache_config` "
    "(`tokens_per_block` for the scenario's `engine.block_size`, `enable_block_reuse: true` for "
    "a workload with cached prefixes)",
    "engine/bench.sh": "bash: `bash bench.sh vllm` (or `sglang`, when emitted) runs the engine's "
    "own load test of the planned workload at every planned load, against a server started "
    "with the files above; its header says how the workload is approximated and holds the "
    "commented-out controlled-test servers (acceptance forced to the profile's rates)",
    "engine/bench/vllm/LABEL.json": "written by `bash bench.sh vllm`: one `vllm bench serve "
    "--save-result --save-detailed` result per load (LABEL: `rate-4`, `concurrency-16`, "
    "`share-2.5`, `capacity-3.1`, as `engine.bench.loads` names them), with TTFT, TPOT, ITL "
    "and E2EL at p50, p90 and p99; what `specsim validate --bench DIR` reads",
    "engine/bench/sglang/LABEL.jsonl": "written by `bash bench.sh sglang`: one "
    "`bench_serving --output-details` line per load",
}

# With --disaggregated: each pool's files, and the split block's own keys.
SPLIT_ENGINE_FILES = {
    "engine/vllm-prefill.args, vllm-decode.args, vllm-decode.json": "with --disaggregated: "
    "each pool's vLLM instance as above, with `--kv-transfer-config` (NixlConnector, kv_role "
    "kv_both), the prefill pool without speculation",
    "engine/sglang-prefill.args, sglang-decode.args": "with --disaggregated: each pool's "
    "server as above, with `--disaggregation-mode prefill|decode` and "
    "`--disaggregation-transfer-backend mooncake`",
    "engine/trtllm-prefill.yaml, trtllm-decode.yaml, trtllm-disagg.yaml": "with "
    "--disaggregated: each pool's servers' options as above with `cache_transceiver_config`, "
    "and `trtllm-serve disaggregated`'s file (`context_servers`, `generation_servers`: "
    "`num_instances`, `urls`); a split plan writes no bench.sh",
}
SPLIT_SUMMARY_KEYS = {
    "engine.recommended": "the split layout written: `layout`, `setting` (speculation or "
    "speculation off), `prefill_replicas`, `decode_replicas`, the decode pool's `drafter` and "
    "`k`",
    "engine.models": "as above",
    "engine.vllm, engine.sglang, engine.trtllm": "per engine asked for: `files`, `written` "
    "per pool (`prefill`, `decode`; TensorRT-LLM also `disaggregated`), `router` (how requests "
    "reach the pools), `not_expressible` and `notes` (each prefixed with its pool); an engine "
    "that cannot express a pool has only `files` (empty) and `refused`",
    "engine.bench, engine.bench_note": "null, and why: a split fleet is load-tested through "
    "its router",
}

ENGINE_SUMMARY_KEYS = {
    "engine.recommended": "the setting written: `drafter` (null: speculation off), `k` (a "
    "table's largest), `k_by_batch` (the rows, or null for a static k), `reason` in words, and "
    "`not_expressible`: what the plan chose that no engine can run, and what stands in for it",
    "engine.models": "per model (`target` and the drafter): `path` and `source` (`given` with "
    "--model, `profile`: the profile's description read as a Hugging Face id, or `placeholder`: "
    "REPLACE-ME/NAME, to be replaced)",
    "engine.vllm, engine.sglang, engine.trtllm": "per engine asked for: `files`, `written` "
    "(the keys and values the files set), `not_expressible` (with what was written instead) "
    "and `notes` (assumptions the files rest on)",
    "engine.bench": "`file`, `clients`, `results` (the folders bench.sh writes into), the "
    "lengths sent (`prompt_tokens`, `output_tokens`: uniform [low, high]), `burstiness` (the "
    "gamma shape of the gaps; null: evenly spaced), `loads` (`label`, `request_rate`, null for a "
    "closed loop's clients, `max_concurrency`, `num_prompts`) and `notes` (the approximations)",
}


def engine_section() -> list[str]:
    """``--emit``'s files, after the three commands that take it."""
    return [
        "## `--emit vllm,sglang,trtllm`: `engine/`",
        "`specsim plan window`, `specsim plan capacity` and `specsim report drafter-swap` with "
        "`--emit` (any subset) also write the recommended setting in each engine's own keys, "
        "atomically with the rest; a rerun removes the engine files it no longer writes (never "
        "`engine/bench/`). The setting is the k-by-batch table when `plan window` recommends "
        "it, else the best static k at the swept load nearest the scenario's own (`plan "
        "capacity`: the chosen candidate; `report drafter-swap`: the recommended drafter). "
        "With `--policies`, one rule for the three commands: the best policy an engine runs "
        "(the goodput policy left out) is written where it is not the static k and beats "
        "speculation off (an engine's own policy, or a k-by-batch table; `plan window` writes "
        "its table only where it recommends it). "
        "Each file is checked against the engine's documented constraints before it is "
        "written; what an engine cannot express (the goodput-adaptive policy; a k-by-batch "
        "table on SGLang) is said in its header and in summary.json, with what was written "
        "instead. Speculation off is the plain configuration, with no speculative option. "
        "`vllm.json` is the bare `--speculative-config` value because JSON carries no "
        "comment: its header is in `vllm.args`, which holds the whole argument list.",
        meanings(ENGINE_FILES, "file", "what it holds"),
        "### `summary.json`: `engine`",
        meanings(ENGINE_SUMMARY_KEYS),
        "### `plan capacity --disaggregated --emit`",
        "The cheapest split layout the plan chose (with speculation when it costs no more), one "
        "file per pool and engine, each with its engine's disaggregation options "
        "(engine-formats.md §3.8, §4.8, §5.7).",
        meanings(SPLIT_ENGINE_FILES, "file", "what it holds"),
        meanings(SPLIT_SUMMARY_KEYS),
    ]
