"""Per-request acceptance as the engines return it with each response.

- vLLM, served with ``--per-request-spec-decode-metrics summary`` (or ``detailed``; vLLM pull
  request 48915, merged): each response's ``metrics.speculative_decoding`` holds
  ``acceptance_histogram`` (a dense list: index j = verify steps that accepted exactly j
  drafts; a sparse ``{"j": count}`` map is read too), ``num_spec_steps`` (the histogram's
  sum), ``num_accepted_draft_tokens`` (sum of j x count), ``num_draft_tokens``,
  ``num_spec_tokens`` (k), ``mean_acceptance_length`` and ``draft_acceptance_rate``.
- SGLang (``python/sglang/srt/managers/tokenizer_manager_components/spec_decoding_meta.py`` at
  sgl-project/sglang 9155cf0e6effbca15e163d04907ff1933b684b3a): each response's ``meta_info``
  holds ``spec_verify_ct`` (verify steps), ``spec_num_correct_drafts`` (accepted drafts),
  ``spec_num_proposed_drafts`` (verify steps x k), ``spec_accept_length`` (completion tokens /
  verify steps) and ``spec_correct_drafts_histogram`` (index j = steps that accepted j drafts,
  as long as the most accepted), with the older names ``spec_accepted_drafts``,
  ``spec_proposed_drafts``, ``spec_accept_token_num``, ``spec_draft_token_num`` and
  ``spec_accept_histogram``. Without a count of accepted drafts they are taken from the length:
  round(length x steps) - steps - 1, since the completion counts the prompt pass's token too.

A file is JSON (one response, a list of them, or any document that nests them, such as a
benchmark client's saved per-request records) or JSON Lines. Every object under a
``speculative_decoding`` key with ``num_spec_tokens``, or under a ``meta_info`` key with
``spec_verify_ct``, is one request's record; requests with no verify step are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specsim.bounds import MAX_COUNT, MAX_K
from specsim.errors import SpecsimError
from specsim.fileio import read_text

VLLM_KEY = "speculative_decoding"
SGLANG_KEY = "meta_info"
SGLANG_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
SGLANG_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
SGLANG_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


@dataclass(frozen=True)
class RequestAcceptance:
    """The speculative requests of one file: steps and accepted drafts per request, and each
    request's histogram where every request has one."""

    engine: str  # vllm or sglang
    k: int
    steps: list[int]
    accepted: list[int]
    histograms: list[list[int]] | None

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + sum(self.accepted) / sum(self.steps)


def looks_like_json(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def read_request_acceptance(path: str | Path) -> RequestAcceptance:
    source = str(path)
    records = _records(_documents(read_text(path, "per-request responses"), source))
    engines = {engine for engine, _ in records}
    if not records:
        raise SpecsimError(
            f"no per-request acceptance ({VLLM_KEY} or {SGLANG_KEY} with spec_verify_ct)",
            file=source,
            key=VLLM_KEY,
            fix="serve vLLM with --per-request-spec-decode-metrics summary, or SGLang with "
            "speculation, and save the responses",
        )
    if len(engines) > 1:
        raise SpecsimError(
            "the file mixes vLLM and SGLang responses",
            file=source,
            key=SGLANG_KEY,
            fix="give one engine's responses per file",
        )
    engine = engines.pop()
    read = _vllm if engine == "vllm" else _sglang
    rows = [read(record, source) for _, record in records]
    rows = [row for row in rows if row[1] > 0]  # requests that never speculated
    ks = sorted({row[0] for row in rows})
    if len(ks) != 1:
        what = "no step" if not ks else "windows k = " + ", ".join(map(str, ks))
        raise SpecsimError(
            f"the requests drafted {what}",
            file=source,
            key="num_spec_tokens" if engine == "vllm" else "spec_verify_ct",
            fix="give the responses of one deployment, at one k, that speculated",
        )
    histograms = [row[3] for row in rows]
    return RequestAcceptance(
        engine=engine,
        k=ks[0],
        steps=[row[1] for row in rows],
        accepted=[row[2] for row in rows],
        histograms=None if any(h is None for h in histograms) else histograms,
    )


def _documents(text: str, source: str) -> list:
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    documents = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            documents.append(json.loads(line))
        except json.JSONDecodeError:
            raise SpecsimError(
                "neither a JSON document nor JSON Lines",
                file=source,
                key=f"line {number}",
                fix="give the responses as saved: one JSON document, or one per line",
            ) from None
    return documents


def _records(value, found: list | None = None) -> list[tuple[str, dict]]:
    found = [] if found is None else found
    if isinstance(value, list):
        for item in value:
            _records(item, found)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key == VLLM_KEY and isinstance(item, dict) and "num_spec_tokens" in item:
                found.append(("vllm", item))
            elif key == SGLANG_KEY and isinstance(item, dict) and "spec_verify_ct" in item:
                found.append(("sglang", item))
            else:
                _records(item, found)
    return found


def _count(record: dict, key: str, source: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise SpecsimError(
            f"{key} is {value!r}, not a count",
            file=source,
            key=key,
            fix="give the responses as the engine wrote them",
        )
    return value


def _histogram(record: dict, key: str, k: int, source: str) -> list[int] | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, dict) and all(str(j).isdigit() for j in value):
        dense = [0] * (max((int(j) for j in value), default=0) + 1)
        for j, count in value.items():
            dense[int(j)] = count
        value = dense
    if not isinstance(value, list) or len(value) > k + 1:
        raise SpecsimError(
            f"{key} is not a list of at most k + 1 = {k + 1} counts",
            file=source,
            key=key,
            fix="give the responses as the engine wrote them",
        )
    counts = [_count({key: c}, key, source) for c in value]
    return counts + [0] * (k + 1 - len(counts))


def _check(histogram, steps, accepted, key: str, source: str) -> None:
    if histogram is None:
        return
    if sum(histogram) != steps or sum(j * c for j, c in enumerate(histogram)) != accepted:
        raise SpecsimError(
            f"{key} disagrees with the request's step or accepted-draft counts",
            file=source,
            key=key,
            fix="give the responses as the engine wrote them",
        )


def _vllm(record: dict, source: str) -> tuple[int, int, int, list[int] | None]:
    k = _count(record, "num_spec_tokens", source)
    if not 1 <= k <= MAX_K:
        raise SpecsimError(
            f"num_spec_tokens is {k}, outside 1..{MAX_K}",
            file=source,
            key="num_spec_tokens",
            fix="give the responses of a deployment that speculates",
        )
    histogram = _histogram(record, "acceptance_histogram", k, source)
    steps = _count(record, "num_spec_steps", source) if "num_spec_steps" in record else None
    accepted = record.get("num_accepted_draft_tokens")
    accepted = _count(record, "num_accepted_draft_tokens", source) if accepted is not None else None
    if histogram is not None:
        steps = sum(histogram) if steps is None else steps
        accepted = sum(j * c for j, c in enumerate(histogram)) if accepted is None else accepted
    if steps is None or accepted is None:
        raise SpecsimError(
            "a request has neither acceptance_histogram nor num_spec_steps and "
            "num_accepted_draft_tokens",
            file=source,
            key="acceptance_histogram",
            fix="serve with --per-request-spec-decode-metrics summary or detailed",
        )
    _check(histogram, steps, accepted, "acceptance_histogram", source)
    return k, steps, accepted, histogram


def _first(record: dict, keys: tuple[str, ...]) -> str | None:
    return next((key for key in keys if key in record), None)


def _sglang(record: dict, source: str) -> tuple[int, int, int, list[int] | None]:
    steps = _count(record, "spec_verify_ct", source)
    proposed_key = _first(record, SGLANG_PROPOSED)
    if steps == 0:
        return 0, 0, 0, None
    if proposed_key is None:
        raise SpecsimError(
            "meta_info does not say how many drafts were proposed, so k is unknown",
            file=source,
            key=SGLANG_PROPOSED[0],
            fix="use an SGLang version that returns spec_num_proposed_drafts",
        )
    proposed = _count(record, proposed_key, source)
    k, rest = divmod(proposed, steps)
    if rest or not 1 <= k <= MAX_K:
        raise SpecsimError(
            f"{proposed_key} {proposed} is not a whole k (1..{MAX_K}) per verify step ({steps})",
            file=source,
            key=proposed_key,
            fix="give the responses as SGLang wrote them",
        )
    histogram_key = _first(record, SGLANG_HISTOGRAM)
    histogram = _histogram(record, histogram_key, k, source) if histogram_key else None
    accepted_key = _first(record, SGLANG_ACCEPTED)
    if accepted_key is not None:
        accepted = _count(record, accepted_key, source)
    elif histogram is not None:
        accepted = sum(j * c for j, c in enumerate(histogram))
    elif "spec_accept_length" in record:
        accepted = _accepted_from_length(record, steps, source)
    else:
        raise SpecsimError(
            "meta_info has spec_verify_ct but no count of accepted drafts",
            file=source,
            key=SGLANG_ACCEPTED[0],
            fix="use an SGLang version that returns spec_num_correct_drafts",
        )
    _check(histogram, steps, accepted, histogram_key or SGLANG_HISTOGRAM[0], source)
    return k, steps, accepted, histogram


def _accepted_from_length(record: dict, steps: int, source: str) -> int:
    length = record["spec_accept_length"]
    if isinstance(length, bool) or not isinstance(length, (int, float)) or length < 1:
        raise SpecsimError(
            f"spec_accept_length is {length!r}, not a length of at least 1",
            file=source,
            key="spec_accept_length",
            fix="give the responses as SGLang wrote them",
        )
    # Completion tokens = accepted drafts + one token per verify step + the prompt pass's one.
    return max(round(length * steps) - steps - 1, 0)
