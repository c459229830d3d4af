"""Add tree acceptance of the built-in pairs to profiles/builtin-cpu.yaml (its other sections
unchanged): the profiler's tree walk (``measure_acceptance(tree_shapes=...)``) on the prompts,
temperatures, token counts and seed the shipped profile was measured with. Run from the
repository root: ``python profiles/measure-builtin-trees.py`` (CPU, minutes on 2 cores).
Refuses a profile that already has a tree_acceptance section (remove it to measure again).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from specsim.models import load_tokenizer
from specsim.profile import load_profile
from specsim.profiling.acceptance_measure import measure_acceptance
from specsim.profiling.measure import MeasureOptions, _load_models, _prompt_ids
from specsim.profiling.specs import parse_drafter
from specsim.profiling.writer import round_floats
from specsim.tree import TreeShape

PROFILE = Path("profiles/builtin-cpu.yaml")
SHAPES = ["2,2,1", "4,2,1", "2,2,2,2", "1,1,1,1"]
SEED = 0
MAX_PROMPTS = 64
MAX_NEW_TOKENS = 128
TEMPERATURES = [1.0, 0.7]


def main() -> int:
    text = PROFILE.read_text()
    if load_profile(PROFILE).profile.tree_acceptance is not None:
        print(f"{PROFILE} already has tree_acceptance; remove it to measure again")
        return 1
    drafters = [parse_drafter(f"{name}=specsim-draft-{name}") for name in ("small", "tiny")]
    opts = MeasureOptions(
        target="specsim-target",
        drafters=drafters,
        name="builtin-cpu",
        temperatures=TEMPERATURES,
        seed=SEED,
        max_prompts=MAX_PROMPTS,
        max_new_tokens=MAX_NEW_TOKENS,
    )
    models = _load_models(opts, None)
    tokenizer = load_tokenizer(opts.target)
    limit = min(m.config.max_position for m in models.values())
    ids, _, _ = _prompt_ids(opts, tokenizer, limit, MAX_NEW_TOKENS)
    result = measure_acceptance(
        models["target"],
        models,
        drafters,
        ids,
        TEMPERATURES,
        max_new_tokens=MAX_NEW_TOKENS,
        seed=SEED,
        eos_id=getattr(tokenizer, "eos_id", None),
        tree_shapes=[TreeShape.parse(s) for s in SHAPES],
    )
    entries = {"tree_acceptance": round_floats(result.tree_entries)}
    block = yaml.safe_dump(entries, sort_keys=False, width=100, default_flow_style=None)
    PROFILE.write_text(text.rstrip("\n") + "\n" + block)
    load_profile(PROFILE)  # the merged file validates
    print(f"{len(result.tree_entries)} tree entries added to {PROFILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
