"""The compiled loops' array layouts, without numba: the float slots both loops' state arrays
begin with (the decode step's, ``compiled_step_kernel.apply_step``), and the serving kernel's
(``compiled_serving_kernel``): the columns of its request table and records, and the slots of
its float and count arrays."""

# The decode step's float slots, first in both loops' state arrays.
(
    DECODE_KV,
    EMITTED,
    NOW,
    LAST_END,
    VERIFICATION,
    DRAFTER_FLOPS,
    WASTED,
    WINDOW_ROWS,
    DECODE_ROWS,
) = range(9)
STEP_STATE = 9

# A request's row in ``req`` (``Request``'s fields, as floats: all whole numbers below 2^53).
(
    RID,
    ARRIVAL,
    PROMPT,
    OUTPUT,
    SCHEDULED,
    FIRST,
    GENERATED,
    STEPS,
    DRAFTED,
    ACCEPTED,
    PREEMPTIONS,
    LEVEL,
    TARGET,
    PREFILLED,
    ADMIT,
    CLIENT,
    HIT,  # the request's prefix-cache hit (``Admission.capped_hit``), not a ``Request`` field
    SHARED_HELD,  # what it holds of a shared prefix (``SharedPrefix.holders``), 0: none
) = range(18)
FIELDS = 18
# The ``Request`` attribute in each column, and those that are times (the rest are counts).
REQUEST_FIELDS = (
    "rid",
    "arrival",
    "prompt",
    "output",
    "scheduled",
    "first_token",
    "generated",
    "steps",
    "drafted",
    "accepted",
    "preemptions",
    "level",
    "prefill_target",
    "prefilled",
    "admit_order",
    "client",
)
TIME_FIELDS = frozenset({"arrival", "scheduled", "first_token"})
RECORD = 11  # a record: the sink's row up to preemptions (the replica and pool are Python's)
# A prefill replica's hand-off is a record whose first token is this (the decode side streams
# it, ``disagg.PrefillReplica.hand_off``); its end is the hand-off's time.
HANDED_OFF = -1.0

# ``st``: floats in and out (the decode step's, then these).
(
    RESERVED,
    PENDING,
    KV_CAPACITY,
    HELD,
    PREFILL_FLOPS,
    PREFILL_COMPUTED,
    PREFIX_QUERIED,
    HORIZON,
    TOKEN_BUDGET,
    OPENED_AT,
    OPENED_EMITTED,
    CLOSED_AT,
    CLOSED_EMITTED,
    DELAY,  # the API server's delay on a client's request (``fleet.Frontend``)
    PREFIX_HITS,  # ``Admission.prefix_hits``
    # ``StepCosts.range_limits``: batch low and high, context high, new tokens low and high.
    RANGE_BATCH_LO,
    RANGE_BATCH_HI,
    RANGE_CONTEXT,
    RANGE_NEW_LO,
    RANGE_NEW_HI,
    # A decode replica's draft-model prompt passes owed (``DecodeReplica.prompt_pass``): rows,
    # tokens, query-key pairs.
    OWED_ROWS,
    OWED_TOKENS,
    OWED_PAIRS,
    # A shared prefix's holders (``SharedPrefix``): the sum of the sizes held, and the largest.
    SHARED_TOTAL,
    SHARED_TOP,
    # TensorRT-LLM's acceptance off-switch (``engine_policies.AcceptanceGate``): its samples'
    # threshold, its samples' running sum, and when the iteration that tripped it ended.
    GATE_THRESHOLD,
    GATE_SUM,
    GATE_OFF_AT,
    # The workload's acceptance shift (``AcceptanceShift``): the first request index, and the
    # first arrival time, that shift (infinite: no such trigger).
    SHIFT_RID,
    SHIFT_AT,
) = range(STEP_STATE, STEP_STATE + 30)
STATE = STEP_STATE + 30
# A window policy's own floats follow ``st``'s slots (``serving_policy.policy_floats``): the
# off-switch's ring of its last ``GATE_WINDOW`` samples; or SGLang's adaptive steps' tiers,
# ``STEPS_STRIDE`` floats each (these slots, then its candidates in increasing order), then its
# first changes (time, tier's min_batch, steps), ``REPORTED_CHANGES`` at most.
POLICY_AT = STATE
REPORTED_CHANGES = 50  # a run's summary lists this many of the steps' changes
(
    TIER_MIN_BATCH,
    TIER_STEPS,
    TIER_EMA,
    TIER_BATCHES,
    TIER_ALPHA,
    TIER_INTERVAL,
    TIER_WARMUP,
    TIER_UP,
    TIER_DOWN,
    TIER_CANDIDATES,  # how many
) = range(10)
TIER_SLOTS = 10

# ``ct``: counts in and out.
(
    HIGH,
    DECODING,
    JOINED,
    DECODE_STEPS,
    ADMISSIONS,
    NEXT_RID,
    ISSUE_LEFT,
    LENGTHS_AT,
    LEVELS_AT,
    Q_HEAD,
    Q_LEN,
    P_HEAD,
    P_LEN,
    FREE_N,
    FIRST_LO,
    FIRST_HI,
    FIRST_LEFT,
    OPENED,
    CLOSED,
    RECORDS,
    ITERATIONS,
    LOGGED,
    FILLED,
    DRAWN,
    ISSUED,
    ROWS_FREE_N,
    ARRIVALS_AT,
    MORE_ARRIVALS,
    CLIENTS,
    PEND_HEAD,  # the ring of clients' requests sent but not yet arrived
    PEND_LEN,
    ITERATION_LIMIT,  # the call stops after this many iterations
    STOP_AT_FINISH,  # 1: the call stops after the iteration in which a request finishes
    OPEN_UNTIL,  # 1 + the last iteration whose admission could reach a request queued last
    PREFILL_APART,  # 1: prefill not chunked, waiting prompts run whole in iterations of their own
    JITTERED,  # 1: iteration times take the replica's multipliers (``Jitter``)
    PADDED,  # 1: padded attention (``engine.padded_attention``)
    CHECKS_RANGES,  # 1: the profile's range still reports a query outside it (``RANGE_*``)
    HANDS_OFF,  # 1: a prefill replica's (``disagg.PrefillReplica``): a prompt through leaves
    # 1: a decode replica's (``disagg.DecodeReplica``): a request whose KV cache has arrived
    # joins the batch without prefill, and nothing is looked up in a prefix cache.
    JOINS,
    PROMPT_PASS,  # 1: a request that joins owes its draft model's prompt pass (``OWED_*``)
    CHARGED,  # the admissions an iteration's seconds have paid for (``Replica.charged_admissions``)
    BLOCK_SIZE,  # ``engine.block_size``: the cache counted in blocks of it (0: in tokens)
    SHARED,  # 1: the prefix's hits are one shared sequence, held once (``SHARED_*``)
    # The off-switch: its window (0: none), its ring's head and length (at ``POLICY_AT``), the
    # samples recorded, and the sample that tripped it (0: not tripped).
    GATE_WINDOW,
    GATE_HEAD,
    GATE_LEN,
    GATE_RECORDED,
    GATE_TRIPPED,
    # Adaptive steps: its tiers (0: none), the floats each takes, the tier that chose this
    # iteration's steps (-1: none yet), and the changes of steps so far.
    STEPS_TIERS,
    STEPS_STRIDE,
    STEPS_CURRENT,
    STEPS_CHANGED,
    SHIFT_LEVELS,  # the levels a shifted request's level moves on by (0: no shift)
) = range(54)
COUNTS = 54
