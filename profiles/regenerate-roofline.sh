#!/usr/bin/env bash
# Rewrite the shipped roofline profiles from the hardware specs, model configs and assumed
# acceptance files in this folder. Run from the repository root. (Measured profiles are written
# by `specsim profile` on the machine they describe; see each file's provenance.command.)
set -euo pipefail
roofline() {  # HW-SPEC TARGET DRAFTER ACCEPTANCE OUT [DEPLOYMENT OPTIONS: --tp N, --weights-dtype D]
  specsim profile roofline --hardware "profiles/hardware/$1.yaml" \
    --target "profiles/models/$2.json" --drafter "$3=profiles/models/$3.json" --drafter ngram \
    --acceptance-from "profiles/acceptance/$4.assumed.yaml" --out "profiles/$5-roofline.yaml" \
    "${@:6}"
}
roofline h100-sxm llama3.1-8b llama3.2-1b llama3.1-8b_llama3.2-1b llama3.1-8b_llama3.2-1b_h100
roofline a100-sxm-80gb llama3.1-8b llama3.2-1b llama3.1-8b_llama3.2-1b llama3.1-8b_llama3.2-1b_a100
roofline h100-sxm qwen2.5-7b qwen2.5-0.5b qwen2.5-7b_qwen2.5-0.5b qwen2.5-7b_qwen2.5-0.5b_h100
roofline l40s llama3.1-8b llama3.2-1b llama3.1-8b_llama3.2-1b llama3.1-8b_llama3.2-1b_l40s
roofline h200-sxm llama3.1-8b llama3.2-1b llama3.1-8b_llama3.2-1b llama3.1-8b_llama3.2-1b_h200
# A 70B target does not fit one 80 GB device in bf16: four H100s (tensor parallel, the 1B
# drafter sharded alike, vLLM's default), or one H200 in FP8. Acceptance is the 8B pair's
# (assumed either way; see each profile's notes).
roofline h100-sxm llama3.1-70b llama3.2-1b llama3.1-8b_llama3.2-1b llama3.1-70b_llama3.2-1b_4xh100-tp4 \
  --tp 4
roofline h200-sxm llama3.1-70b llama3.2-1b llama3.1-8b_llama3.2-1b llama3.1-70b_llama3.2-1b_h200-fp8 \
  --weights-dtype fp8 --kv-dtype fp8
# Eight H100s (TP8, bf16): the other side of plan capacity's TP4-against-TP8 question.
roofline h100-sxm llama3.1-70b llama3.2-1b llama3.1-8b_llama3.2-1b llama3.1-70b_llama3.2-1b_8xh100-tp8 \
  --tp 8
# DeepSeek-V3 (671 B, a mixture of experts) drafting with its own MTP module on eight H200s in
# FP8 (84.1 GB of weights per device, shared experts in FP8 too; bf16 does not fit). Acceptance assumed (see its notes).
specsim profile roofline --hardware profiles/hardware/h200-sxm.yaml \
  --target profiles/models/deepseek-v3.json --drafter mtp=mtp --drafter ngram \
  --acceptance-from profiles/acceptance/deepseek-v3_mtp.assumed.yaml \
  --out profiles/deepseek-v3_mtp_8xh200-fp8-roofline.yaml --tp 8 --weights-dtype fp8 --kv-dtype fp8
# EAGLE-3 heads (kind heads, one pass per drafted depth; the head's config in profiles/models),
# acceptance published by vLLM for the 8B head at temperature 0 (see the acceptance file).
eagle3() {  # HW-SPEC TARGET HEAD OUT [DEPLOYMENT OPTIONS]
  specsim profile roofline --hardware "profiles/hardware/$1.yaml" \
    --target "profiles/models/$2.json" --drafter "eagle3=eagle3:profiles/models/$3.json" \
    --drafter ngram --acceptance-from profiles/acceptance/llama3.1-8b_eagle3.assumed.yaml \
    --out "profiles/$4-roofline.yaml" "${@:5}"
}
eagle3 h100-sxm llama3.1-8b eagle3-llama3.1-8b llama3.1-8b_eagle3_h100
eagle3 h200-sxm llama3.1-8b eagle3-llama3.1-8b llama3.1-8b_eagle3_h200
eagle3 h100-sxm llama3.3-70b eagle3-llama3.3-70b llama3.3-70b_eagle3_4xh100-tp4 --tp 4
eagle3 h200-sxm llama3.3-70b eagle3-llama3.3-70b llama3.3-70b_eagle3_h200-fp8 \
  --weights-dtype fp8 --kv-dtype fp8
# DeepSeek-V3 with its MTP module on two GB300s in NVFP4 (FP4 values, an FP8 scale per 16: the
# decoder layers' matrices at the GB300's FP4 peak; embedding, LM head and norms in bf16) with
# an fp8 KV cache, the deployment of issue 30's point 4. Acceptance assumed, as on H200.
specsim profile roofline --hardware profiles/hardware/gb300.yaml \
  --target profiles/models/deepseek-v3.json --drafter mtp=mtp --drafter ngram \
  --acceptance-from profiles/acceptance/deepseek-v3_mtp.assumed.yaml \
  --out profiles/deepseek-v3_mtp_2xgb300-nvfp4-roofline.yaml --tp 2 --weights-dtype nvfp4 \
  --kv-dtype fp8
