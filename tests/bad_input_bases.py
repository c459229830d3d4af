"""The valid inputs the bad-input corpus spoils one value at a time (see ``bad_input_corpus``).

Every optional section of the scenario and profile schemas is present here, so that every key
of theirs has a place to put a bad value; ``test_bad_inputs`` checks that this stays so, and that
the base commands built on these files succeed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

FIT = {
    "fixed_s": 0.004,
    "per_sequence_s": 1.0e-5,
    "per_batched_token_s": 2.0e-6,
    "knee_tokens": 16.0,
    "per_kv_token_s": 1.0e-8,
    "per_attention_pair_s": 1.0e-10,
    "experts": {"weights_s": 0.002, "experts": 8, "experts_per_token": 2},
    "held_out": {
        "method": "leave-one-out",
        "points": 4,
        "median_rel_error": 0.02,
        "max_rel_error": 0.05,
    },
}
LATENCY = {
    "fit": FIT,
    "valid_range": {"batch": [1, 64], "context": [0, 100000], "new_tokens": [1, 10000]},
    "outside_range": "extrapolate",
    "samples": [
        {
            "batch": 1,
            "context": 16,
            "new_tokens": 1,
            "seconds": 0.004,
            "spread_s": 0.0001,
            "repeats": 3,
            "phase": "decode",
        }
    ],
}
SIZES = {
    "params": 1_000_000_000,
    "layers": 16,
    "hidden_size": 2048,
    "vocab_size": 32000,
    "kv_bytes_per_token": 65536,
    "weight_bytes": 2_000_000_000,
    "flops_per_token": 2.0e9,
    "attention_flops_per_context_token": 65536.0,
}
DRAFT_OVERHEAD = {
    "per_draft_step_s": 1.0e-5,
    "per_draft_token_s": 1.0e-6,
    "per_prefill_s": 1.0e-5,
    "per_prefill_token_s": 1.0e-7,
    "per_speculative_step_s": 1.0e-5,
    "per_speculative_sequence_s": 1.0e-6,
}
ACCEPTANCE = {
    "drafter": "d1",
    "verifier": "rejection",
    "temperature": 1.0,
    "per_position": [0.8, 0.7, 0.6],
    "mean_acceptance_length": {1: 1.8, 2: 2.4},
    "acceptance_histograms": [{"k": 2, "counts": [1, 2, 3], "requests": [[1, 1, 1], [0, 1, 2]]}],
    "proposal_rate": 1.0,
    "request_concentration": 5.0,
    "token_beta_mean": 0.8,
    "tv_distance": 0.0,
    "sequences": {"path": "sequences.txt", "kind": "run_length", "requests": 3},
    "source": "measured",
    "tokens_scored": 1000,
}
NGRAM_ACCEPTANCE = {
    "drafter": "ngram",
    "verifier": "rejection",
    "temperature": 1.0,
    "per_position": [0.5, 0.6],
    "proposal_rate": 0.5,
}
PROFILE: dict[str, Any] = {
    "version": 1,
    "name": "bad-input-base",
    "provenance": {
        "source": "measured",
        "device": "test device",
        "date": "2026-01-01",
        "software": {"specsim": "test"},
        "command": "hand-written",
        "notes": "the bad-input corpus's base profile",
        "profiling_seconds": 10.0,
        "calibration": {
            "prior": "prior.yaml",
            "prior_source": "roofline",
            "files": [
                {
                    "path": "bench.json",
                    "sha256": "0" * 64,
                    "runs": 1,
                    "format": "vllm-bench",
                    "engine": "vllm",
                    "engine_version": "0.33.0",
                    "model": "target",
                }
            ],
            "terms": [
                {
                    "name": "target.decode",
                    "kind": "factor",
                    "value": 1.2,
                    "prior": 1.0,
                    "determined": True,
                    "spread_ratio": 0.1,
                }
            ],
            "threshold": 0.5,
            "fit_median_abs_error": 0.02,
            "held_out": {"runs": 2, "median_abs_error": 0.03, "max_abs_error": 0.05},
            "runs_source": "the corpus's own runs",
            "checked": {
                "files": [
                    {
                        "path": "unseen.json",
                        "sha256": "1" * 64,
                        "runs": 1,
                        "format": "vllm-bench",
                        "engine": "vllm",
                        "engine_version": "0.33.0",
                        "model": "target",
                    }
                ],
                "runs": ["rate-8"],
                "figures": {
                    "throughput_tokens_per_s": {
                        "runs": 1,
                        "median_abs_error": 0.04,
                        "max_abs_error": 0.04,
                    }
                },
            },
            "report": "p.calibration.json",
        },
        "speed_reference": {
            "decode_s": 0.004,
            "prefill_s": 0.01,
            "host_s": 0.0001,
            "drafters": {"d1": {"decode_s": 0.001, "prefill_s": 0.003}},
            "slowdown": 1.0,
            "overhead_pass_scale": 1.0,
        },
    },
    "hardware": {
        "name": "test-gpu",
        "memory_bytes": 80.0e9,
        "price_per_hour_usd": 2.0,
        "peak_flops": 1.0e15,
        "memory_bandwidth_bytes_per_s": 3.0e12,
        "tensor_parallel_size": 2,
    },
    "target": {
        "kind": "target",
        "description": "target",
        **SIZES,
        "latency": copy.deepcopy(LATENCY),
        "overhead": dict(DRAFT_OVERHEAD),
        # A replica of two devices: half the weights and KV heads on each.
        "sharding": {
            "tensor_parallel_size": 2,
            "weight_bytes_per_device": 1_000_000_000,
            "kv_bytes_per_token_per_device": 32768,
        },
        "precision": {"weights": "bfloat16", "kv_cache": "bfloat16"},
    },
    "drafters": {
        "d1": {
            "kind": "draft_model",
            **SIZES,
            "latency": {**copy.deepcopy(LATENCY), "fit": {**copy.deepcopy(FIT), "fixed_s": 0.001}},
            "draft_step_s": 0.0,
            "overhead": dict(DRAFT_OVERHEAD),
            "sharding": {
                "tensor_parallel_size": 1,
                "weight_bytes_per_device": 2_000_000_000,
                "kv_bytes_per_token_per_device": 65536,
            },
            "precision": {"weights": "bfloat16", "kv_cache": "bfloat16"},
        },
        "ngram": {"kind": "ngram", "draft_step_s": 1.0e-5},
        # EAGLE-style heads: the walk reaches d1 only, so their passes key has hand cases.
        "h1": {
            "kind": "heads",
            "draft_step_s": 1.0e-4,
            "flops_per_token": 1.0e7,
            "passes": "autoregressive",
        },
    },
    "overhead": {
        "per_step_s": 1.0e-4,
        "per_sequence_s": 1.0e-6,
        "per_draft_step_s": 1.0e-5,
        "per_draft_token_s": 1.0e-6,
        "per_prefill_s": 1.0e-5,
        "per_prefill_token_s": 1.0e-7,
        "source": "stated",
    },
    "jitter": {"quantiles": [0.9, 1.0, 1.1], "samples": 10, "source": "measured"},
    "prefill_jitter": {"quantiles": [0.95, 1.0, 1.05], "samples": 10, "source": "measured"},
    "acceptance": copy.deepcopy([ACCEPTANCE, NGRAM_ACCEPTANCE]),
    "tree_acceptance": [
        {
            "drafter": "d1",
            "verifier": "rejection",
            "temperature": 1.0,
            "tree": [[0], [1], [0, 0]],
            "drafts": "iid",
            "accepted_length": [0.3, 0.3, 0.4],
            "mean_acceptance_length": 2.1,
            "rates": [[0.5, 0.4], [0.6]],
            "source": "measured",
            "derived_from": "hand-written",
            "tokens_scored": 100,
            "monte_carlo": {"seed": 0, "samples": 64, "standard_error": 0.001},
        }
    ],
}
SPECULATION = {
    "drafter": "d1",
    "k": 2,
    "verifier": "rejection",
    "temperature": 1.0,
    "policy": "fixed",
    "k_by_batch": [{"max_batch": 4, "k": 2}],
    "acceptance": "per_position",
    "heterogeneity": True,
    "max_concurrency": 8,
    "acceptance_gate": {"threshold": 0.2, "window": 5},
    "acceptance_shift": {"after_requests": 6, "factor": 0.5},
}
# SGLang's adaptive steps (their own policy, so a base of their own).
ADAPTIVE_STEPS: dict[str, Any] = {
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "up_hysteresis": 0.0,
    "down_hysteresis": -0.25,
    "tiers": [
        {"min_batch": 1, "candidate_steps": [1, 2], "up_hysteresis": 0.0, "down_hysteresis": 0.0}
    ],
}
SCENARIO: dict[str, Any] = {
    "name": "bad-input-base",
    "description": "the bad-input corpus's base scenario",
    "seed": 1,
    "profile": "profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 20.0,
        "cv": 2.0,
        "duration_s": 5.0,
        "requests": 12,
        "concurrency": 2,
        "think_time_s": 0.0,
        "time_scale": 1.0,
        "prompt": {
            "dist": "lognormal",
            "value": 8,
            "low": 4,
            "high": 64,
            "median": 16.0,
            "sigma": 0.5,
        },
        "output": {"dist": "uniform", "low": 2, "high": 16},
        "prefix": {"source": "system_prompt", "length": 8, "hit_rate": 0.5},
    },
    "engine": {
        "max_batch": 8,
        "block_size": 16,
        "chunked_prefill": True,
        "max_batched_tokens": 512,
        "memory_utilisation": 0.9,
        "kv_capacity_tokens": 100000,
        "tensor_parallel_size": 2,  # the base profile's
        # The profile's own TP, so nothing is scaled: present for the corpus to spoil.
        "tensor_parallel_scaling": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-6},
        "padded_attention": False,
        "jitter": True,
    },
    "speculation": copy.deepcopy(SPECULATION),
    "fleet": {
        "replicas": 1,
        "router": "cache_aware",
        "balance_abs_threshold": 4,
        "pools": [
            {
                "name": "main",
                "replicas": 1,
                "speculation": {
                    **copy.deepcopy(SPECULATION),
                    "k_by_batch": [{"max_batch": 4, "k": 1}],
                },
            }
        ],
    },
    "slo": {"ttft_s": 1.0, "tpot_s": 0.1, "e2e_s": 10.0, "queueing_s": 5.0},
}
# The real engine's constraints (specsim validate): whole-prompt prefill, one replica, padding.
VALIDATE_SCENARIO: dict[str, Any] = {
    "name": "bad-input-validate",
    "seed": 1,
    "profile": "profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 4.0,
        "requests": 8,
        "prompt": {"dist": "fixed", "value": 16},
        "output": {"dist": "fixed", "value": 8},
    },
    "engine": {"max_batch": 2, "chunked_prefill": False, "padded_attention": True},
    "speculation": {"drafter": "ngram", "k": 2},
}
# validate --bench: the same setting, speculation off (the base benchmark run's).
BENCH_SCENARIO: dict[str, Any] = {
    **{k: v for k, v in copy.deepcopy(VALIDATE_SCENARIO).items() if k != "speculation"},
    "name": "bad-input-bench",
}
TRACE_SCENARIO: dict[str, Any] = {
    "name": "bad-input-trace",
    "profile": "profile.yaml",
    "workload": {"kind": "trace", "trace": "trace.csv", "format": "vidur"},
    "engine": {"max_batch": 8},
    "speculation": {"drafter": "d1", "k": 2},
}
SEQUENCES_SCENARIO: dict[str, Any] = {
    **copy.deepcopy(SCENARIO),
    "name": "bad-input-sequences",
    "fleet": {"replicas": 1},
    "speculation": {"drafter": "d1", "k": 2, "acceptance": "sequences"},
}
# A disaggregated fleet (no pools beside it): the base scenario's other sections (its cached
# prefixes and KV blocks too), split 1P1D.
DISAGGREGATION: dict[str, Any] = {
    "prefill": {"replicas": 1, "profile": "profile.yaml", "tensor_parallel_size": 2},
    "decode": {"replicas": 1, "profile": "profile.yaml", "tensor_parallel_size": 2},
    "kv_transfer": {"bandwidth_bytes_per_s": 5.0e10, "latency_s": 2.0e-5},
    "decode_router": "least_outstanding",
}
DISAGG_SCENARIO: dict[str, Any] = {
    **copy.deepcopy(SCENARIO),
    "name": "bad-input-disagg",
    "fleet": {"router": "round_robin", "disaggregation": copy.deepcopy(DISAGGREGATION)},
}
HARDWARE = {
    "name": "test accelerator",
    "memory_bytes": 80.0e9,
    "peak_flops": 1.0e15,
    "memory_bandwidth_bytes_per_s": 3.0e12,
    "dtype": "bfloat16",
    "price_per_hour_usd": 2.0,
    "price_note": "example",
    "source": "test",
    "peak_flops_fp8": 2.0e15,
    "peak_flops_fp4": {"nvfp4": 4.0e15},
    "nvlink": {"bandwidth_bytes_per_s": 4.5e11, "latency_s": 1.0e-6},
    "pcie": {"bandwidth_bytes_per_s": 6.4e10, "latency_s": 2.0e-6},
    "efficiency": {
        "mfu": 0.5,
        "bandwidth": 0.8,
        "launch_s_per_layer": 1.0e-5,
        "memory_utilization": 0.9,
        "interconnect": 0.8,
    },
}
TARGET_CONFIG = {
    "_name_or_path": "test/target",
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_hidden_layers": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
DRAFT_CONFIG = {**TARGET_CONFIG, "_name_or_path": "test/draft", "num_hidden_layers": 2}
ACCEPTANCE_FILE = {"notes": "assumed", "acceptance": copy.deepcopy([ACCEPTANCE, NGRAM_ACCEPTANCE])}
METRICS = """\
vllm:spec_decode_num_drafts_total{engine="0"} 1000.0
vllm:spec_decode_num_draft_tokens_total{engine="0"} 3000.0
vllm:spec_decode_num_accepted_tokens_total{engine="0"} 1800.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 800.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 600.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 400.0
"""
# A vllm bench serve 0.33 result without speculation: four requests at 2/s, 64 + 16 tokens.
BENCH = {
    "backend": "vllm",
    "model_id": "target",
    "num_prompts": 4,
    "request_rate": 2.0,
    "burstiness": 1.0,
    "max_concurrency": None,
    "duration": 2.0,
    "completed": 4,
    "total_input_tokens": 256,
    "total_output_tokens": 64,
    "request_throughput": 2.0,
    "output_throughput": 32.0,
    **{f"{s}_ttft_ms": 9.0 for s in ("mean", "median", "p99")},
    **{f"{s}_tpot_ms": 4.5 for s in ("mean", "median", "p99")},
    **{f"{s}_itl_ms": 4.5 for s in ("mean", "median", "p99")},
}
PROMPTS = "".join(json.dumps({"prompt": f"Tell me about the number {i}."}) + "\n" for i in range(3))
TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
TRACE_ROWS = [(0.1 * i, 10 + i, 5 + i % 3) for i in range(10)]
SEQUENCES = "3 1 2 4\n1 1 3\n2 2 2 1\n"
RUN_REQUESTS = 10


def engine_run(folder: Path, shift: float) -> None:
    """An engine run's requests.csv (``specsim validate``'s engine/ folder), ``RUN_REQUESTS``
    rows; ``shift`` moves the log-likelihoods so the two runs differ a little."""
    import numpy as np

    from specsim.engine.records import format_csv

    n = RUN_REQUESTS
    ints = np.arange(n, dtype=np.int64)
    records = {
        "id": ints,
        "arrival_s": 0.5 * ints.astype(float),
        "scheduled_s": 0.5 * ints + 0.01,
        "first_token_s": 0.5 * ints + 0.05,
        "finish_s": 0.5 * ints + 0.4,
        "prompt_tokens": 16 + ints,
        "output_tokens": 8 + ints % 3,
        "steps": 4 + ints % 2,
        "drafted": 8 + ints % 2,
        "accepted": 4 + ints % 2,
        "preemptions": 0 * ints,
        "replica": 0 * ints,
        "pool": np.asarray(["main"] * n),
        "target_logprob_mean": -1.0 - 0.05 * ints - shift,
        "eos": ints % 2,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "requests.csv").write_text(format_csv(records), encoding="utf-8")


class _PlainDumper(yaml.SafeDumper):
    """No anchors and aliases: each key of a file stands on its own."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_PlainDumper, sort_keys=False)


def write_base(folder: Path) -> None:
    """Every base input file, into ``folder``."""
    files = {
        "scenario.yaml": dump(SCENARIO),
        "validate.yaml": dump(VALIDATE_SCENARIO),
        "trace_scenario.yaml": dump(TRACE_SCENARIO),
        "sequences_scenario.yaml": dump(SEQUENCES_SCENARIO),
        "profile.yaml": dump(PROFILE),
        "hardware.yaml": dump(HARDWARE),
        "target.json": json.dumps(TARGET_CONFIG, indent=1),
        "draft.json": json.dumps(DRAFT_CONFIG, indent=1),
        "acceptance.yaml": dump(ACCEPTANCE_FILE),
        "metrics.txt": METRICS,
        "bench.json": json.dumps(BENCH),
        "bench_scenario.yaml": dump(BENCH_SCENARIO),
        "prompts.jsonl": PROMPTS,
        "trace.csv": ",".join(TRACE_COLUMNS)
        + "\n"
        + "".join(",".join(str(v) for v in row) + "\n" for row in TRACE_ROWS),
        "sequences.txt": SEQUENCES,
    }
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "bench").mkdir()  # validate --bench DIR: a folder of result files
    (folder / "bench" / "bench.json").write_text(json.dumps(BENCH), encoding="utf-8")
    engine_run(folder / "baseline", 0.0)
    engine_run(folder / "candidate", 0.01)


D = "{d}"  # the case folder, filled in when the case runs
OUT = f"{D}/out"


# A valid command line of each (sub)command over the base inputs. Options given again after
# these replace them (argparse keeps the last), so a case appends the option it spoils.
BASE_COMMANDS: dict[str, list[str]] = {
    "simulate": ["simulate", f"{D}/scenario.yaml", "--out", OUT],
    "plan window": [
        *("plan", "window", f"{D}/scenario.yaml", "--k", "0..1", "--loads", "10"),
        *("--workers", "1", "--no-progress", "--out", OUT),
    ],
    "plan capacity": [
        *("plan", "capacity", f"{D}/scenario.yaml", "--target-rps", "20", "--k", "1"),
        *("--tolerance", "0.3", "--workers", "1", "--no-progress", "--out", OUT),
    ],
    "report drafter-swap": [
        *("report", "drafter-swap", f"{D}/scenario.yaml", "--drafter", "d1", "--drafter"),
        *("ngram", "--k", "0..1", "--loads", "10", "--workers", "1", "--no-progress"),
        *("--out", OUT),
    ],
    "profile roofline": [
        *("profile", "roofline", "--hardware", f"{D}/hardware.yaml"),
        *("--target", f"{D}/target.json", "--drafter", f"d1={D}/draft.json"),
        *("--drafter", "ngram=ngram", "--acceptance-from", f"{D}/acceptance.yaml"),
        *("--out", f"{OUT}/p.yaml"),
    ],
    "profile calibrate": [
        *("profile", "calibrate", f"{D}/metrics.txt", "--into", f"{D}/profile.yaml"),
        *("--drafter", "d1", "--verifier", "rejection", "--temperature", "1.0"),
        *("--out", f"{OUT}/p.yaml"),
    ],
    "profile from-bench": [
        *("profile", "from-bench", f"{D}/bench.json", "--into", f"{D}/profile.yaml"),
        # The base run's round figures fit the base profile poorly: written, not refused.
        "--accept-poor-fit",
        *("--no-held-out", "--out", f"{OUT}/p.yaml"),
    ],
    # Measuring takes minutes: every case of it must fail before the timing starts.
    "profile measure": [
        *(
            "profile",
            "measure",
            "--target",
            "specsim-target",
            "--drafter",
            "small=specsim-draft-small",
        ),
        *("--prompts", f"{D}/prompts.jsonl", "--out", f"{OUT}/p.yaml"),
    ],
    "check rollout": [
        *("check", "rollout", "--baseline", f"{D}/baseline", "--candidate", f"{D}/candidate"),
        *("--out", OUT),
    ],
    # Runs the real engine: every case of it must fail before the engine starts.
    "validate": ["validate", f"{D}/validate.yaml", "--profile", f"{D}/profile.yaml", "--out", OUT],
    "validate bench": [
        *("validate", f"{D}/bench_scenario.yaml", "--bench", f"{D}/bench"),
        *("--profile", f"{D}/profile.yaml", "--replications", "0", "--out", OUT),
    ],
    "check sampler": ["check", "sampler", "--samples", "0", "--out", OUT],
    "schema": ["schema", "scenario"],
}


# Commands quick enough to run as positive controls (the base must succeed).
QUICK = (
    "simulate",
    "plan window",
    "plan capacity",
    "report drafter-swap",
    "profile roofline",
    "profile calibrate",
    "profile from-bench",
    "validate bench",
    "check rollout",
    "check sampler",
    "schema",
)
