"""Roofline profiler: a job spec and GPU types -> phase times of one RL iteration.

RollMux plans admission with *worst-case* phase times: every response is assumed to reach the
job's ``max_response_tokens`` (RollMux §4.2 "conservative planning"). This module turns a
:class:`~rollmux.models.JobSpec` into a :class:`~rollmux.models.PhaseProfile` with a small,
documented roofline model; ``job.measured`` wins over the model whenever it is given.

Model (all constants below, module level, documented and configurable by monkeypatching):

* **Rollout** (memory-bandwidth bound decode, RollMux §2 "(1) Rollout"). The model is sharded
  over ``tp`` GPUs (smallest power of two whose HBM holds the bf16 weights within
  :data:`WEIGHT_HBM_FRACTION`), giving ``NR // tp`` engine replicas. Each replica keeps as many
  sequences in flight as its free HBM holds KV cache for (context at the end of the response),
  capped at :data:`MAX_BATCH_SEQS`; the ``S = num_prompts * responses_per_prompt`` sequences go
  in ``waves``. One decode step reads the weights once plus the batch's KV cache
  (``kv_bytes_per_token = KV_BYTES_PER_TOKEN_PER_BPARAM * params_b``) at
  ``HBM_BW_EFFICIENCY`` of the replica's bandwidth, plus :data:`DECODE_STEP_OVERHEAD_S`.
  Worst case: every sequence decodes ``max_response_tokens`` steps. Prefill is compute bound:
  ``2 * params * prompt_tokens * S / (NR * peak * PREFILL_MFU)``. Multi-turn repeats this for
  each of ``turns`` rounds, the context growing by one response per round, plus
  :data:`ENV_STEP_S` of environment/tool latency per round.
* **Training** (compute bound): ``TRAIN_FLOPS_PER_PARAM_TOKEN * params * tokens /
  (NT * peak * TRAIN_MFU)`` with ``tokens = S * (prompt + response) * turns`` (6 for forward and
  backward, +2 for the old-policy / reference log-prob forwards of PPO/GRPO).
* **Sync** (network bound, RollMux §5 weight sync): the time the runtime's own sync plan
  predicts (:func:`rollmux.sync_plan.build_plan` between the job's NT training and NR rollout
  GPUs, :meth:`~rollmux.sync_plan.SyncPlan.predict`): one bf16 model copy, sharded over the
  training GPUs, crosses the slow cross-cluster link and the receivers broadcast their shards
  inside the rollout cluster, the two stages pipelined bucket by bucket, plus
  :data:`SYNC_BUCKET_LATENCY_S` per bucket round. It grows with the model's size (no fixed term).
  The flat baseline (veRL-style) makes every rollout GPU pull a full copy across the slow link. A
  colocated job reshards over the intra-cluster fabric only.

Calibration: Qwen-7B, 256 prompts x 8 responses, 8k tokens, 8 H20 + 8 H800 gives a worst-case
rollout of ~380 s and training of ~360 s (4k tokens: ~110 / ~190 s); 14B-32B jobs with 16k tokens
reach ~2000-2400 s in the worst case (~600 s at a mean of half the cap). The paper's phases span
50-900+ s (RollMux Fig. 2); worst-case planning is deliberately above the typical
phase, and shorter batches (fewer prompts) bring large models back into that range.

Host memory (for the residency constraint, RollMux §4.2 (1)): see :func:`state_gb`.
Training-GPU memory (a necessary condition beside it): see :func:`train_gpu_state_gb`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from rollmux.models import MAX_PHASE_S, ClusterSpec, GPUType, JobSpec, PhaseProfile, PoolName
from rollmux.staleness import weight_copies

# --- rollout (decode) -------------------------------------------------------------------------
#: KV-cache bytes per token per billion parameters. Qwen2.5-7B (28 layers, 4 KV heads x 128, bf16)
#: stores 57,344 B/token and Qwen2.5-32B (64 layers, 8 KV heads) 262,144 B/token: ~8.2 KB per B.
KV_BYTES_PER_TOKEN_PER_BPARAM = 8192.0
#: weights may use at most this fraction of a tensor-parallel group's HBM (rest: KV cache).
WEIGHT_HBM_FRACTION = 0.5
#: fraction of HBM usable by the engine (vLLM ``gpu_memory_utilization`` default 0.9).
HBM_USABLE_FRACTION = 0.9
#: achieved fraction of peak HBM bandwidth during decode.
HBM_BW_EFFICIENCY = 0.7
#: fixed per-decode-step cost (scheduling, sampling, kernel launches), seconds.
DECODE_STEP_OVERHEAD_S = 0.003
#: vLLM's default ``max_num_seqs`` per engine replica.
MAX_BATCH_SEQS = 256
#: achieved fraction of bf16 peak during prefill.
PREFILL_MFU = 0.5
#: environment / tool latency per multi-turn round, seconds.
ENV_STEP_S = 5.0
# --- training ---------------------------------------------------------------------------------
#: FLOPs per parameter per token for one training pass (6 fwd+bwd, +2 log-prob forwards).
TRAIN_FLOPS_PER_PARAM_TOKEN = 8.0
#: model FLOPs utilisation of RL training (Megatron/FSDP on H800-class GPUs).
TRAIN_MFU = 0.35
# --- sync ---------------------------------------------------------------------------------------
#: fixed cost of one bucket round of a weight sync (collective launch), seconds.
SYNC_BUCKET_LATENCY_S = 1e-4
#: the model is planned as this many equal tensors (a transformer's layers) for the sync plan.
SYNC_PLAN_TENSORS = 64
# --- host-memory state ----------------------------------------------------------------------
#: training state bytes per parameter: bf16 weights 2 + fp32 master 4 + fp32 grads 4 + Adam 8
#: + bf16 reference model 2.
TRAIN_STATE_BYTES_PER_PARAM = 20.0
#: data pipeline, replay buffer and activation checkpoints per training GPU, as a fraction of the
#: GPU's HBM (H800: 16 GB per GPU, 128 GB per 8-GPU node).
TRAIN_PIPELINE_HBM_FRACTION = 0.2
#: rollout state bytes per parameter per node: one bf16 host copy the replicas reload from.
ROLL_STATE_BYTES_PER_PARAM = 2.0
#: inference-engine state (CUDA graphs, sampler, prompt data, offloaded KV metadata) per rollout
#: GPU, as a fraction of the GPU's HBM (H20: 9.6 GB per GPU).
ROLL_ENGINE_HBM_FRACTION = 0.1

# --- training-GPU state (ZeRO paper, Rajbhandari et al., SC'20, §3.1 and Fig. 1) ----------------
#: bytes per parameter of (weights, gradients, optimizer state) with AdamW, by training precision.
#: ``bf16_mixed``: bf16 weights 2 + bf16 gradients 2 + (fp32 master weights 4 + fp32 Adam
#: momentum 4 + variance 4) = 16 (the ZeRO paper's 2 + 2 + K=12). ``fp32``: 4 + 4 + 8 = 16.
#: ``bf16`` (pure bf16 incl. the moments, e.g. DeepSpeed ``bf16`` with a bf16 optimizer): 2 + 2 + 4 = 8.
TRAIN_GPU_BYTES_PER_PARAM: dict[str, tuple[float, float, float]] = {
    "bf16_mixed": (2.0, 2.0, 12.0),
    "fp32": (4.0, 4.0, 8.0),
    "bf16": (2.0, 2.0, 4.0),
}

#: default log-normal shape of response lengths (long tail, RollMux Fig. 11).
RESPONSE_LENGTH_SIGMA = 1.0


@dataclass(frozen=True)
class RolloutModel:
    """Intermediate quantities of the rollout roofline (for inspection and the sampler).

    Attributes:
        tp: GPUs per engine replica; replicas: engine replicas over the NR GPUs;
        concurrency: sequences in flight per replica; sequences: S per turn;
        step_s: seconds per decode step at full batch; prefill_s: prefill seconds per turn.
    """

    tp: int
    replicas: int
    concurrency: int
    sequences: int
    step_s: float
    prefill_s: float


def _resolve(job: JobSpec, cluster: ClusterSpec, rollout_gpu, num_rollout_gpus, train_gpu, num_train_gpus):
    rg = rollout_gpu or cluster.rollout_pool.node.gpu
    tg = train_gpu or cluster.train_pool.node.gpu
    nr = num_rollout_gpus if num_rollout_gpus is not None else job.num_rollout_gpus
    nt = num_train_gpus if num_train_gpus is not None else job.num_train_gpus
    if nr <= 0 or nt <= 0:
        raise ValueError(f"GPU counts must be positive (num_rollout_gpus={nr}, num_train_gpus={nt})")
    return rg, nr, tg, nt


def rollout_model(job: JobSpec, gpu: GPUType, num_gpus: int, response_tokens: int) -> RolloutModel:
    """Roofline quantities of one rollout turn on ``num_gpus`` GPUs of ``gpu``.

    Raises ValueError when the bf16 weights do not fit in the HBM of all ``num_gpus`` GPUs.
    Source: module docstring (roofline decode model).
    """
    weight_b = 2.0 * job.model_params_b * 1e9
    hbm_b = gpu.hbm_gb * 1e9
    tp = 1
    while weight_b > WEIGHT_HBM_FRACTION * tp * hbm_b and tp < num_gpus:
        tp *= 2
    tp = min(tp, num_gpus)
    kv_budget = HBM_USABLE_FRACTION * tp * hbm_b - weight_b
    if kv_budget <= 0:
        raise ValueError(
            f"job {job.job_id}: {job.model_params_b}B weights do not fit on {num_gpus} x {gpu.name} "
            f"({gpu.hbm_gb} GB HBM each)"
        )
    replicas = max(1, num_gpus // tp)
    kv_tok = KV_BYTES_PER_TOKEN_PER_BPARAM * job.model_params_b
    end_ctx = job.prompt_tokens + response_tokens * job.turns
    conc = int(max(1, min(MAX_BATCH_SEQS, kv_budget // (kv_tok * end_ctx))))
    seqs = job.num_prompts * job.responses_per_prompt
    batch = min(conc, math.ceil(seqs / replicas))
    avg_ctx = job.prompt_tokens + response_tokens * (job.turns + 1) / 2.0 - response_tokens / 2.0
    step_bytes = weight_b + batch * avg_ctx * kv_tok
    step_s = step_bytes / (tp * gpu.hbm_tb_per_s * 1e12 * HBM_BW_EFFICIENCY) + DECODE_STEP_OVERHEAD_S
    prefill_s = 2.0 * job.model_params_b * 1e9 * job.prompt_tokens * seqs / (num_gpus * gpu.bf16_tflops * 1e12 * PREFILL_MFU)
    return RolloutModel(tp=tp, replicas=replicas, concurrency=conc, sequences=seqs, step_s=step_s, prefill_s=prefill_s)


def _rollout_time(job: JobSpec, gpu: GPUType, nr: int, tokens: int) -> float:
    m = rollout_model(job, gpu, nr, tokens)
    waves = math.ceil(math.ceil(m.sequences / m.replicas) / m.concurrency)
    per_turn = m.prefill_s + waves * tokens * m.step_s
    # later turns re-prefill the grown context; env latency per round for multi-turn jobs
    env = ENV_STEP_S * job.turns if job.multi_turn else 0.0
    return per_turn * job.turns + env


def _train_time(job: JobSpec, gpu: GPUType, nt: int, tokens: int) -> float:
    seq_tokens = job.num_prompts * job.responses_per_prompt * (job.prompt_tokens + tokens) * job.turns
    flops = TRAIN_FLOPS_PER_PARAM_TOKEN * job.model_params_b * 1e9 * seq_tokens
    return flops / (nt * gpu.bf16_tflops * 1e12 * TRAIN_MFU)


@lru_cache(maxsize=4096)
def _plan_sync_s(model_bytes: int, n_train: int, n_rollout: int, cross_gbps: float, intra_gbps: float,
                 scheme: str) -> float:
    from rollmux.sync_plan import LinkModel, TensorMeta, build_plan

    k = SYNC_PLAN_TENSORS
    sizes = [model_bytes // k + (1 if i < model_bytes % k else 0) for i in range(k)]
    metas = [TensorMeta(f"layer{i}", (n,), "uint8", n) for i, n in enumerate(sizes)]
    plan = build_plan(metas, n_train, n_rollout, scheme=scheme)  # type: ignore[arg-type]
    return plan.predict(LinkModel(cross_gbps, intra_gbps, latency_s=SYNC_BUCKET_LATENCY_S)).total_s


def sync_time(job: JobSpec, cluster: ClusterSpec, *, scheme: str = "rollmux", num_rollout_gpus: Optional[int] = None,
              colocated: bool = False) -> float:
    """Weight-sync seconds for one iteration, as the runtime's sync plan predicts it.

    ``scheme="rollmux"``: the topology-aware plan between the job's ``num_train_gpus`` trainers
    and ``num_rollout_gpus`` rollout GPUs (one bf16 copy crosses ``cross_cluster_gbps``, shards
    broadcast at ``intra_cluster_gbps``). ``scheme="flat"``: every rollout GPU pulls a full copy
    over the slow link (veRL baseline). ``colocated=True``: resharding inside one cluster (both
    stages at ``intra_cluster_gbps``). Raises ValueError on an unknown scheme.
    Source: RollMux §5.2 weight sync, Fig. 8; :meth:`rollmux.sync_plan.SyncPlan.predict`.
    """
    if scheme not in ("rollmux", "flat"):
        raise ValueError(f"unknown sync scheme {scheme!r} (known: 'rollmux', 'flat')")
    model_bytes = int(round(2.0 * job.model_params_b * 1e9))
    nr = num_rollout_gpus if num_rollout_gpus is not None else job.num_rollout_gpus
    cross = cluster.intra_cluster_gbps if colocated else cluster.cross_cluster_gbps
    return _plan_sync_s(model_bytes, int(job.num_train_gpus), int(nr), float(cross), float(cluster.intra_cluster_gbps),
                        "topo" if scheme == "rollmux" else "flat")


def estimate(job: JobSpec, cluster: ClusterSpec, *, worst_case: bool = True, rollout_gpu: Optional[GPUType] = None,
             num_rollout_gpus: Optional[int] = None, train_gpu: Optional[GPUType] = None,
             num_train_gpus: Optional[int] = None, colocated: bool = False) -> PhaseProfile:
    """Phase times (seconds) of one iteration of ``job`` on ``cluster``.

    ``worst_case=True`` plans every response at ``max_response_tokens`` (admission, RollMux
    §4.2); ``False`` uses ``job.mean_tokens`` (see :func:`expected_profile`). The overrides price
    other hardware, e.g. the colocated baseline passes ``rollout_gpu=<H800>,
    num_rollout_gpus=NT, colocated=True``; Gavel+ passes other GPU counts. ``job.measured`` wins
    over the model when given (and no override is passed).

    The profile carries the job's ``max_staleness`` (0 with ``colocated=True``: rollout and
    training then share the GPUs and cannot overlap).

    Raises ValueError if the model does not fit on the given GPUs or counts are not positive.
    Source: module docstring; RollMux §4.2, Fig. 9 step 1-2 (profiler).
    """
    overrides = any(x is not None for x in (rollout_gpu, num_rollout_gpus, train_gpu, num_train_gpus)) or colocated
    # the job's staleness bound sets how its phases pipeline (rollmux.staleness); colocated, rollout
    # and training share the GPUs and run one after the other whatever the bound
    k = 0 if colocated else job.max_staleness
    if job.measured is not None and not overrides:
        return job.measured.with_staleness(k)
    rg, nr, tg, nt = _resolve(job, cluster, rollout_gpu, num_rollout_gpus, train_gpu, num_train_gpus)
    tokens = job.max_response_tokens if worst_case else job.mean_tokens
    times = {
        "t_roll_s": _rollout_time(job, rg, nr, tokens),
        "t_train_s": _train_time(job, tg, nt, tokens),
        "t_sync_s": sync_time(job, cluster, num_rollout_gpus=nr, colocated=colocated),
    }
    for name, t in times.items():
        if not (math.isfinite(t) and t <= MAX_PHASE_S):
            raise ValueError(f"job {job.job_id}: estimated {name} = {t:.4g} s exceeds the longest allowed phase "
                             f"({MAX_PHASE_S:.0f} s = 7 days); use fewer prompts/tokens or more GPUs")
    return PhaseProfile(**times, max_staleness=k)


def expected_profile(job: JobSpec, cluster: ClusterSpec, **overrides) -> PhaseProfile:
    """Phase times with every response at the job's mean length (an optimistic expectation:
    the long tail of :func:`sample_iteration` is ignored). Same overrides as :func:`estimate`."""
    return estimate(job, cluster, worst_case=False, **overrides)


def state_gb(job: JobSpec, pool: PoolName, cluster: Optional[ClusterSpec] = None) -> float:
    """Host-memory state (GB) the job keeps pinned on *each* node of ``pool``.

    Rollout: one bf16 host copy of the weights (an asynchronous job: one per version it holds,
    :func:`rollmux.staleness.weight_copies`) plus engine state
    (:data:`ROLL_ENGINE_HBM_FRACTION` of each GPU's HBM) per node. Training: weights, fp32 master
    weights, gradients, Adam moments and the reference model (:data:`TRAIN_STATE_BYTES_PER_PARAM`
    bytes/param) spread over the job's training nodes, plus the data pipeline
    (:data:`TRAIN_PIPELINE_HBM_FRACTION` of each GPU's HBM) per node. ``job.mem_roll_gb`` /
    ``job.mem_train_gb`` override. Without ``cluster`` the paper's nodes (8 x H20 96 GB,
    8 x H800 80 GB) are assumed. Paper-scale result: 7B ~ 91 GB (rollout) / 268 GB (training) per
    node; 32B on 2 training nodes ~ 141 / 448 GB.
    Source: RollMux §4.2 (1) (hundreds of GB per job, 2-5 jobs per 1-2 TB node).
    Raises ValueError for an unknown pool.
    """
    if pool == "rollout":
        if job.mem_roll_gb is not None:
            return job.mem_roll_gb
        gpn, hbm = (cluster.rollout_pool.node.gpus_per_node, cluster.rollout_pool.node.gpu.hbm_gb) if cluster else (8, 96.0)
        copies = weight_copies(job.max_staleness, job.staleness_mode)  # an async job holds more than one version
        return ROLL_STATE_BYTES_PER_PARAM * job.model_params_b * copies + ROLL_ENGINE_HBM_FRACTION * hbm * min(gpn, job.num_rollout_gpus)
    if pool == "train":
        if job.mem_train_gb is not None:
            return job.mem_train_gb
        gpn, hbm = (cluster.train_pool.node.gpus_per_node, cluster.train_pool.node.gpu.hbm_gb) if cluster else (8, 80.0)
        nodes = max(1, math.ceil(job.num_train_gpus / gpn))
        return TRAIN_STATE_BYTES_PER_PARAM * job.model_params_b / nodes + TRAIN_PIPELINE_HBM_FRACTION * hbm * min(gpn, job.num_train_gpus)
    raise ValueError(f"unknown pool {pool!r} (known: 'rollout', 'train')")


def train_gpu_state_gb(job: JobSpec) -> float:
    """Weights, gradients and optimizer state (GB) one training GPU of the job holds.

    ``P = model_params_b * 1e9`` parameters, ``N = num_train_gpus``, bytes per parameter
    ``(w, g, o)`` from :data:`TRAIN_GPU_BYTES_PER_PARAM[job.train_precision]` (AdamW), sharded by
    ZeRO stage (ZeRO paper §5.1-5.3, Fig. 1): stage 0 ``(w + g + o) P``; stage 1 ``(w + g) P + o P / N``;
    stage 2 ``w P + (g + o) P / N``; stage 3 (FSDP full shard) ``(w + g + o) P / N``.
    Activations, the frozen reference model and engine buffers are not counted, so exceeding the
    GPU's HBM means the job can never train on these GPUs (e.g. 70B, bf16 mixed, ZeRO-3 on 8
    H800s: 16 x 70e9 / 8 = 140 GB > 80 GB).
    """
    w, g, o = TRAIN_GPU_BYTES_PER_PARAM[job.train_precision]
    p_gb, n = job.model_params_b, job.num_train_gpus  # 1e9 params x bytes = GB
    per_stage = {0: (w + g + o) * p_gb, 1: (w + g) * p_gb + o * p_gb / n, 2: w * p_gb + (g + o) * p_gb / n,
                 3: (w + g + o) * p_gb / n}
    return per_stage[job.zero_stage]


def move_time_s(job: JobSpec, cluster: ClusterSpec) -> float:
    """Seconds to copy the job's pinned host state to other nodes of the same pools (both pools,
    one after the other, at ``intra_cluster_gbps``)."""
    gb = state_gb(job, "rollout", cluster) + state_gb(job, "train", cluster)
    return gb * 8.0 / cluster.intra_cluster_gbps


# --- stochastic rollouts ------------------------------------------------------------------------

def sample_response_lengths(job: JobSpec, rng: np.random.Generator, n: Optional[int] = None,
                            sigma: float = RESPONSE_LENGTH_SIGMA) -> np.ndarray:
    """Seeded long-tailed response lengths (tokens), shape ``(n,)`` (default ``n = S``).

    Log-normal with shape ``sigma`` and the unclipped mean equal to ``job.mean_tokens``, clipped
    to ``[1, max_response_tokens]``: a few stragglers hit the cap (RollMux §3.2 C2, Fig. 11).
    """
    n = job.num_prompts * job.responses_per_prompt if n is None else n
    mu = math.log(job.mean_tokens) - sigma * sigma / 2.0
    return np.clip(rng.lognormal(mu, sigma, size=n), 1.0, job.max_response_tokens)


def response_finish_times(job: JobSpec, cluster: ClusterSpec, lengths: np.ndarray,
                          profile: Optional[PhaseProfile] = None) -> np.ndarray:
    """Modelled finish time (s from the rollout's start) of each response, shape ``(n,)``,
    ascending: entry ``k`` is the moment the ``k+1`` shortest responses are done.

    Fluid continuous batching (the model of :func:`sample_iteration`): with response lengths
    ``l_i`` and ``slots`` = replicas x concurrency (:func:`rollout_model` at the cap), a rollout
    whose lengths are all truncated at ``L`` takes ``max(max_i min(l_i, L), sum_i min(l_i, L) /
    slots)`` decode steps; the ``k``-th shortest response is done when the rollout truncated at
    its length would be. Scaled so that all-max lengths take ``profile.t_roll_s`` (default the
    worst-case :func:`estimate`); the last entry is the rollout's time. Source: RollMux §4.3, Fig. 7.
    """
    prof = profile or estimate(job, cluster)
    m = rollout_model(job, cluster.rollout_pool.node.gpu, job.num_rollout_gpus, job.max_response_tokens)
    slots = m.replicas * m.concurrency
    ls = np.sort(np.asarray(lengths, dtype=float))
    n = len(ls)
    cap = float(job.max_response_tokens)
    worst = max(cap, cap * n / slots)
    # truncated at ls[k]: sum = cumsum[k] + (n - k - 1) * ls[k]; max = ls[k]
    trunc_sum = np.cumsum(ls) + (n - np.arange(1, n + 1)) * ls
    return prof.t_roll_s * np.maximum(ls, trunc_sum / slots) / worst


def token_fraction(job: JobSpec, lengths: np.ndarray) -> float:
    """Generated plus prompt tokens of a batch with response ``lengths`` over the worst case
    (every response at ``max_response_tokens``): the factor training time scales with."""
    ls = np.asarray(lengths, dtype=float)
    return float((job.prompt_tokens + ls).sum()) / (len(ls) * (job.prompt_tokens + float(job.max_response_tokens)))


def sample_iteration(job: JobSpec, cluster: ClusterSpec, rng: np.random.Generator, *,
                     trigger_fraction: float = 0.8, profile: Optional[PhaseProfile] = None):
    """One iteration's stochastic phase times, as :class:`rollmux.intra_group.IterationTimes`.

    Fluid continuous-batching model consistent with the worst case: with response lengths
    ``l_i`` (from :func:`sample_response_lengths`) the rollout takes
    ``max(max_i l_i, sum_i l_i / slots) * step_s`` per turn (``slots`` = replicas x concurrency);
    the moment ``trigger_fraction`` of the responses are done is the same expression with every
    length truncated at the ``trigger_fraction`` quantile (``t_trigger_s``, when long-tail
    migration may fire; ``tail_load`` = unfinished responses at that moment / slots, which sets
    how much the tail stretches when packed onto fewer GPUs); both are entries of
    :func:`response_finish_times`. Training scales with the generated tokens
    (:func:`token_fraction`). The result is scaled so that
    all-max lengths reproduce ``profile`` (default: the worst-case :func:`estimate`), so measured
    profiles are honoured. Source: RollMux §4.3 long-tail migration, Fig. 7.
    """
    if not 0.0 < trigger_fraction <= 1.0:
        raise ValueError(f"trigger_fraction must be in (0, 1], got {trigger_fraction}")
    prof = profile or estimate(job, cluster)
    lengths = sample_response_lengths(job, rng)
    return iteration_times(job, cluster, lengths, trigger_fraction=trigger_fraction, profile=prof)


def iteration_times(job: JobSpec, cluster: ClusterSpec, lengths: np.ndarray, *, trigger_fraction: float = 0.8,
                    profile: Optional[PhaseProfile] = None):
    """The :class:`rollmux.intra_group.IterationTimes` of one iteration whose responses have
    ``lengths`` (tokens, shape ``(n,)``): see :func:`sample_iteration` (which draws the lengths)."""
    from rollmux.intra_group import IterationTimes

    prof = profile or estimate(job, cluster)
    m = rollout_model(job, cluster.rollout_pool.node.gpu, job.num_rollout_gpus, job.max_response_tokens)
    slots = m.replicas * m.concurrency
    fin = response_finish_times(job, cluster, lengths, prof)
    n = len(fin)
    k = int(math.ceil(trigger_fraction * n))
    return IterationTimes(
        t_roll_s=float(fin[-1]),
        t_train_s=prof.t_train_s * token_fraction(job, lengths),
        t_sync_s=prof.t_sync_s,
        t_trigger_s=float(fin[min(n - 1, k - 1)]),
        tail_load=(n - k) / slots,
    )
