"""Load models the same way whatever their origin: a built-in name, a Hugging Face directory, or a
``config.json`` alone (seeded random weights: latency does not depend on weight values).

Built-in models are stored in exactly the Hugging Face layout (``config.json`` plus
``model.safetensors`` with Hugging Face key names), so they go through the same code path as a
user's model directory (the families ``families.py`` lists). Sharded checkpoints
(``model.safetensors.index.json``) load shard by shard straight onto the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from specsim.errors import SpecsimError
from specsim.fileio import atomic_output_dir, dump_json, read_text
from specsim.models import fp8
from specsim.models.checkpoint import is_unused, to_checkpoint_keys, to_model_keys
from specsim.models.config import ModelConfig
from specsim.models.deepseek_mtp import OPTIONAL, MTPDrafter, MTPModule, check_has_mtp, module_key
from specsim.models.tokenizer import ByteTokenizer, HFTokenizer
from specsim.models.transformer import DecoderModel
from specsim.parsing import parse_json

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
# name -> directory. The target and two drafters of clearly different size and quality, trained
# together on one corpus (see builtin/README.md).
BUILTIN_MODELS: dict[str, Path] = {
    name: BUILTIN_DIR / name
    for name in ("specsim-target", "specsim-draft-small", "specsim-draft-tiny")
}
BUILTIN_PROMPTS = BUILTIN_DIR / "prompts.jsonl"

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Keys some checkpoints carry that are derived, not learned.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _not_found(spec: str) -> SpecsimError:
    return SpecsimError(
        "model not found",
        file=spec,
        fix="give a model directory, a config.json or one of: " + ", ".join(BUILTIN_MODELS),
    )


def resolve(spec: str | Path) -> tuple[Path, bool]:
    """(config.json path, whether weights should be read) for a model spec."""
    text = str(spec)
    if text in BUILTIN_MODELS:
        return BUILTIN_MODELS[text] / "config.json", True
    path = Path(text)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecsimError(
                "no config.json in the model directory",
                file=text,
                fix="give a Hugging Face model directory (config.json + model.safetensors)",
            )
        return path / "config.json", True
    if path.is_file() and path.suffix == ".json":
        return path, False
    raise _not_found(text)


def load_config(spec: str | Path) -> ModelConfig:
    """The architecture of a model spec without building the model."""
    config_path, _ = resolve(spec)
    return ModelConfig.from_file(config_path, name=_name_of(spec, config_path))


def _name_of(spec: str | Path, config_path: Path) -> str:
    text = str(spec)
    if text in BUILTIN_MODELS:
        return text
    path = Path(text)
    return path.name if path.is_dir() else config_path.parent.name or config_path.stem


def load_model(
    spec: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> DecoderModel:
    """A model in eval mode on ``device`` with parameters in ``dtype``.

    ``spec`` is a built-in name, a model directory, or a ``config.json`` (random weights drawn
    from ``seed``; a directory without weight files is an error rather than silently random).
    """
    config_path, with_weights = resolve(spec)
    config = ModelConfig.from_file(config_path, name=_name_of(spec, config_path))
    if with_weights:
        files = _weight_files(config_path.parent)
        with torch.device("meta"):
            model = DecoderModel(config, dtype=dtype)
        _load_weights(model, files, device, dtype)
    else:
        model = DecoderModel(config, device=device, dtype=dtype)
        generator = torch.Generator(device=model.device).manual_seed(seed)
        model.init_weights(generator)
    return model.eval()


def load_mtp_drafter(
    spec: str | Path,
    target: DecoderModel,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> MTPDrafter:
    """The multi-token-prediction module stored in ``target``'s checkpoint ``spec`` (layer
    ``num_hidden_layers``), bound to ``target``; a ``config.json`` gives it seeded random
    weights, as ``load_model`` does."""
    config_path, with_weights = resolve(spec)
    config = target.config
    check_has_mtp(config, str(config_path))
    if not with_weights:
        with torch.device(device):
            module = MTPModule(config, with_embed=False, with_head=False, dtype=dtype)
        generator = torch.Generator(device=device).manual_seed(seed + 1)
        for name, param in sorted(module.named_parameters()):
            torch.nn.init.normal_(param, 0.0, 0.02, generator=generator)
            if name.endswith("norm.weight"):
                param.data.fill_(1.0)
        return MTPDrafter(target, module.eval())
    files = _weight_files(config_path.parent)
    stored = _mtp_entries(config, files, device)
    with torch.device("meta"):
        module = MTPModule(
            config,
            with_embed=OPTIONAL[0] in stored,
            with_head=OPTIONAL[1] in stored,
            dtype=dtype,
        )
    expected = module.state_dict()
    wording = dataclasses.replace(
        _MTP_WORDING,
        shown=lambda name: f"model.layers.{config.num_layers}.{name}".replace(".block.", "."),
    )
    # The whole layer is read already: a missing tensor is named before a misfit one.
    _check_complete(expected, stored, str(config_path.parent), wording)
    entries = ((file, name, name, tensor) for name, (file, tensor) in stored.items())
    loaded = _fitted(expected, entries, str(config_path.parent), dtype, wording)
    module.load_state_dict(loaded, assign=True, strict=True)
    return MTPDrafter(target, module.eval())


def _mtp_entries(config: ModelConfig, files: list[Path], device) -> dict:
    """The MTP layer's stored tensors: module name -> (file, tensor)."""
    found = {}

    def wanted(key: str) -> bool:
        return module_key(config, key) is not None

    for file, key, tensor in _stored_tensors(config, files, device, wanted):
        found[module_key(config, key)] = (file, tensor)
    return found


def _stored_tensors(config: ModelConfig, files: list[Path], device, wanted=None):
    """(file, key, tensor) of every stored tensor but the derived ones whose key ``wanted``
    accepts (None: all), FP8 block-quantised weights dequantised (float32) with their scales,
    which a sharded checkpoint may store in another shard. Unwanted tensors are never read: a
    drafter's one layer must not cost a read of the whole target."""
    from safetensors import SafetensorError, safe_open

    block = config.weight_block_size
    with contextlib.ExitStack() as stack:
        handles = {}
        for file in files:
            try:
                handles[file] = stack.enter_context(
                    safe_open(str(file), framework="pt", device=str(device))
                )
            except (SafetensorError, OSError) as exc:
                raise SpecsimError(
                    f"cannot read weights: {exc}", file=str(file), fix="copy the file again"
                ) from None
        where = {key: handle for handle in handles.values() for key in handle.keys()}  # noqa: SIM118
        for file, handle in handles.items():
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if key.endswith(_IGNORED_SUFFIXES):
                    continue
                if fp8.is_scale(key):
                    _check_scale(key, block, where, str(file))
                    continue
                if wanted is not None and not wanted(key):
                    continue
                tensor = handle.get_tensor(key)
                scale = fp8.scale_key(key)
                if block is not None and scale in where:
                    scales = where[scale].get_tensor(scale)
                    tensor = fp8.dequantise(tensor, scales, block, key, str(file))
                else:
                    fp8.check_stored(tensor, key, block, str(file))
                yield file, key, tensor


def _check_scale(key: str, block, where: dict, source: str) -> None:
    if block is None:
        raise SpecsimError(
            "FP8 block scales, but config.json has no quantization_config",
            file=source,
            key=key,
            fix="use the config.json that belongs to these weights (DeepSeek-V3's declares "
            "quant_method fp8), or a bf16 copy",
        )
    if key.removesuffix(fp8.SCALE_SUFFIX) + ".weight" not in where:
        raise SpecsimError(
            "block scales without their weight",
            file=source,
            key=key,
            fix="download the complete checkpoint",
        )


def _weight_files(directory: Path) -> list[Path]:
    single, index = directory / WEIGHTS_FILE, directory / INDEX_FILE
    if single.is_file():
        return [single]
    if index.is_file():
        fix = "copy the index file again from the model repository"
        data = parse_json(read_text(index, "index file"), str(index), fix)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(shard, str) for shard in weight_map.values()
        ):
            raise SpecsimError(
                "malformed index: weight_map is not a mapping of tensor names to shard files",
                file=str(index),
                key="weight_map",
                fix=fix,
            )
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise SpecsimError(
                f"shard {missing[0]} is missing ({len(missing)} of {len(shards)})",
                file=str(directory),
                fix="download every shard the index lists",
            )
        return [directory / s for s in shards]
    raise SpecsimError(
        f"no {WEIGHTS_FILE} or {INDEX_FILE}",
        file=str(directory),
        fix="add the weights, or pass the config.json itself for random weights",
    )


def _load_weights(
    model: DecoderModel, files: list[Path], device: torch.device | str, dtype: torch.dtype
) -> None:
    def used(key: str) -> bool:
        return not is_unused(model.config, key)

    def entries():
        for file, key, stored in _stored_tensors(model.config, files, device, used):
            if key == "lm_head.weight" and model.config.tie_embeddings:
                continue  # tied: the output projection is the embedding
            for name, tensor in to_model_keys(model.config, key, stored, str(file)):
                yield file, key, name, tensor

    expected = dict(model.state_dict())
    loaded = _fitted(expected, entries(), str(files[0].parent), dtype, _TARGET_WORDING)
    model.load_state_dict(loaded, assign=True, strict=True)


@dataclasses.dataclass(frozen=True)
class _Wording:
    """How a load's errors name its tensors: the target's and the MTP layer's differ."""

    unexpected: str
    unexpected_fix: str
    shape: str  # with {got} and {want}, the stored and the expected shape
    missing: str  # with {count}
    missing_fix: str
    shown: Callable[[str], str] = str  # a missing tensor's key as the checkpoint names it


_TARGET_WORDING = _Wording(
    unexpected="unexpected weight for this architecture",
    unexpected_fix="check model_type, tie_word_embeddings and attention_bias",
    shape="shape {got} does not match the config's {want}",
    missing="weight missing ({count} in all)",
    missing_fix="download the complete checkpoint",
)
_MTP_WORDING = _Wording(
    unexpected="unexpected MTP weight for this architecture",
    unexpected_fix="use the config.json that belongs to these weights",
    shape="MTP weight of shape {got} does not fit the config",
    missing="MTP weight missing ({count} in all)",
    missing_fix="download the complete checkpoint (its MTP layer included)",
)


def _fitted(
    expected: dict[str, torch.Tensor], entries, folder: str, dtype: torch.dtype, wording: _Wording
) -> dict[str, torch.Tensor]:
    """The state dict of ``entries`` ((file, key named when unexpected, name, tensor)), each
    tensor in ``dtype``, refused unless it has exactly ``expected``'s names and shapes."""
    loaded: dict[str, torch.Tensor] = {}
    for file, key, name, tensor in entries:
        if name not in expected:
            raise SpecsimError(
                wording.unexpected, file=str(file), key=key, fix=wording.unexpected_fix
            )
        got, want = tuple(tensor.shape), tuple(expected[name].shape)
        if got != want:
            raise SpecsimError(
                wording.shape.format(got=got, want=want),
                file=str(file),
                key=name,
                fix="use the config.json that belongs to these weights",
            )
        loaded[name] = tensor.to(dtype)
    _check_complete(expected, loaded, folder, wording)
    return loaded


def _check_complete(expected: dict, present, folder: str, wording: _Wording) -> None:
    missing = sorted(set(expected) - set(present))
    if missing:
        raise SpecsimError(
            wording.missing.format(count=len(missing)),
            file=folder,
            key=wording.shown(missing[0]),
            fix=wording.missing_fix,
        )


def save_model(model: DecoderModel, directory: str | Path, dtype: torch.dtype = torch.float16):
    """Write ``config.json`` + ``model.safetensors`` (Hugging Face layout) atomically."""
    from safetensors.torch import save_file

    state = {key: value.detach().to("cpu", dtype) for key, value in model.state_dict().items()}
    tensors = {
        key: value.contiguous() for key, value in to_checkpoint_keys(model.config, state).items()
    }
    config = model.config.to_hf_dict()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    with atomic_output_dir(directory) as staging:
        (staging / "config.json").write_text(dump_json(config), encoding="utf-8")
        save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
    return Path(directory)


def load_tokenizer(spec: str | Path):
    """The tokenizer of a model spec: byte-level for the built-ins (``specsim_tokenizer:
    bytes``), otherwise the directory's ``tokenizer.json``."""
    config_path, _ = resolve(spec)
    config = ModelConfig.from_file(config_path)
    if config.tokenizer == "bytes":
        return ByteTokenizer(
            bos_id=config.bos_id if config.bos_id is not None else ByteTokenizer().bos_id,
            eos_id=config.eos_id if config.eos_id is not None else ByteTokenizer().eos_id,
        )
    tokenizer_json = config_path.parent / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise SpecsimError(
            "no tokenizer.json next to the model's config.json",
            file=str(config_path.parent),
            fix="copy tokenizer.json from the model repository (only text prompts need it)",
        )
    bos, eos = config.bos_id, config.eos_id
    if bos is None or eos is None:
        bos, eos = _ids_from_tokenizer_config(config_path.parent, bos, eos)
    return HFTokenizer(tokenizer_json, bos, eos)


def _ids_from_tokenizer_config(directory: Path, bos: int | None, eos: int | None):
    """Fill missing BOS/EOS ids from tokenizer_config.json's token strings, when present."""
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return bos, eos
    try:
        data = parse_json(read_text(path, "tokenizer_config.json"), str(path), "")
        tokens = parse_json(read_text(directory / "tokenizer.json", "tokenizer.json"), "", "")
    except SpecsimError:  # the tokenizer itself has been read; these ids are a nicety
        return bos, eos
    if not isinstance(data, dict) or not isinstance(tokens, dict):
        return bos, eos
    added = {t.get("content"): t.get("id") for t in tokens.get("added_tokens", [])}

    def token_id(key: str) -> int | None:
        value = data.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return added.get(value) if isinstance(value, str) else None

    return (bos if bos is not None else token_id("bos_token")), (
        eos if eos is not None else token_id("eos_token")
    )
