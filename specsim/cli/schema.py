"""Print the JSON Schema of a specsim file type, so editors can validate and complete it.

specsim schema scenario > scenario.schema.json
specsim schema profile
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# kind -> (module, class). Imported lazily: the scenario schema lives with the simulator.
SCHEMAS = {
    "scenario": ("specsim.scenario", "Scenario"),
    "profile": ("specsim.profile.schema", "Profile"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=sorted(SCHEMAS), help="which file type")


def schema_for(kind: str) -> dict:
    module, name = SCHEMAS[kind]
    model = getattr(importlib.import_module(module), name)
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"specsim {kind}"
    return schema


def run(args: argparse.Namespace) -> int:
    json.dump(schema_for(args.kind), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
