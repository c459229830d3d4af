"""Measure the tree acceptance of the built-in pairs into profiles/builtin-cpu.yaml, its other
sections unchanged: the profiler's tree walk (``measure_tree_acceptance``) on the prompts,
temperatures, token counts and seed the shipped profile was measured with. Run from the
repository root: ``python profiles/measure-builtin-trees.py`` (CPU, some ten minutes on 2
cores). A tree_acceptance section already there (the file's last) is measured again and
replaced; the text before it is kept byte for byte.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from specsim.profile import load_profile
from specsim.profiling.measure import MeasureOptions, measure_tree_acceptance
from specsim.profiling.specs import parse_drafter
from specsim.profiling.writer import round_floats
from specsim.tree import TreeShape

PROFILE = Path("profiles/builtin-cpu.yaml")
SECTION = "\ntree_acceptance:\n"
SHAPES = ["2,2,1", "4,2,1", "2,2,2,2", "1,1,1,1"]
SEED = 0
MAX_PROMPTS = 64
MAX_NEW_TOKENS = 128
TEMPERATURES = [1.0, 0.7]


def main() -> int:
    text = PROFILE.read_text()
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        if any(line[:1].isalpha() for line in rest.splitlines()):
            print(f"{PROFILE}: tree_acceptance is not the last section; move it there")
            return 1
        text = head + "\n"
    drafters = [parse_drafter(f"{name}=specsim-draft-{name}") for name in ("small", "tiny")]
    opts = MeasureOptions(
        target="specsim-target",
        drafters=drafters,
        name="builtin-cpu",
        temperatures=TEMPERATURES,
        seed=SEED,
        max_prompts=MAX_PROMPTS,
        max_new_tokens=MAX_NEW_TOKENS,
        trees=[TreeShape.parse(s) for s in SHAPES],
    )
    entries = measure_tree_acceptance(opts)
    block = yaml.safe_dump(
        {"tree_acceptance": round_floats(entries)},
        sort_keys=False,
        width=100,
        default_flow_style=None,
    )
    PROFILE.write_text(text.rstrip("\n") + "\n" + block)
    load_profile(PROFILE)  # the merged file validates
    print(f"{len(entries)} tree entries written to {PROFILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
