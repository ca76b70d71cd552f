"""The example GRPO job: state builders and phase functions, and their wiring to the phase API.

The phase functions are plain functions of a state dict, so they run identically in-process
(solo / plain mode) and on RollMux's pool workers (scheduled mode):

* rollout state: ``{"engine": RolloutBackend, "sampler": PromptSampler, "rng": torch.Generator,
  "version": int}``; training state: ``{"trainer": TrainBackend, "ref": frozen model | None,
  "step": int}``. Every random draw comes from a generator inside the state (no global RNG), so a
  job re-run solo with the same seed is bit-identical to its co-executed run (RollMux §5).
* :func:`make_job` registers them on a :class:`rollmux.Job`; :func:`run_job` is the user's loop.
* On several nodes (scheduled mode, RollMux §5.1 multi-node phases) every rank runs the same phase
  (:func:`rollmux.parallel` says which rank): a rollout generates its contiguous shard of the
  batch's rows (every rank draws the same prompts and per-call seed from its identical state, so the
  ranks stay in lockstep), :func:`gather_rollout` concatenates the shards in rank order; training is
  data-parallel (each rank takes its shard of every minibatch, gradients are averaged over the job's
  process group by the train backend) and :func:`gather_train` checks that every rank ends with the
  same weights.

Source: GRPO (DeepSeekMath) for the algorithm.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from examples.grpo import algo
from examples.grpo.bind import register_phases
from examples.grpo.config import GRPOJobConfig
from examples.grpo.model import build_model
from examples.grpo.task import PromptSampler, reward
from examples.grpo.tokenizer import CharTokenizer
from rollmux.phase_state import parallel

TOK = CharTokenizer()


class InjectedFailure(RuntimeError):
    """Raised inside the training phase when ``run.fail_in_train_at`` is reached (failure demo)."""


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the raw bytes of every tensor, in key order (bit-for-bit identity check)."""
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode())
        h.update(weights[k].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def build_rollout_state(cfg: GRPOJobConfig) -> dict:
    """Rollout-side state (cold start): engine with the initial policy, sampler, sampling RNG."""
    r = cfg.run
    torch.set_num_threads(r.threads)
    from actors.backends import make_rollout_backend

    model = build_model(cfg.model, r.seed, TOK)
    return {
        "engine": make_rollout_backend(r.rollout_backend, model, device=r.device,
                                       **({"task_family": r.task} if r.rollout_backend == "sched" else {}),
                                       **(_vllm_kw(r) if r.rollout_backend == "vllm" else {})),
        "sampler": PromptSampler(r.task, seed=r.seed + 1, answer_len=r.answer_len),
        "rng": torch.Generator().manual_seed(r.seed + 2),
        "version": 0,
    }


def _vllm_kw(r) -> dict:
    """vLLM engine settings of a job: the KV cache is always sized explicitly (the job's batch of
    full-length sequences unless ``vllm_kv_cache_bytes`` says otherwise), so an engine sharing its
    device with other jobs never runs vLLM's start-up memory profile; on CPU the engine worker
    gets the job's ``threads`` (its tokens then do not depend on where it runs)."""
    kw = {"max_num_seqs": r.batch_size, "threads": r.threads}
    if r.vllm_kv_cache_bytes:
        kw["kv_cache_memory_bytes"] = r.vllm_kv_cache_bytes
    return kw


def build_train_state(cfg: GRPOJobConfig) -> dict:
    """Training-side state (cold start): policy + AdamW in a train backend, frozen reference."""
    r = cfg.run
    torch.set_num_threads(r.threads)
    from actors.backends import make_train_backend

    ctx = parallel("train")
    if r.train_backend == "deepspeed":
        kw = {"micro_batch": r.minibatch_size, "stage": r.zero_stage, "torch_adam": r.torch_adam}
        if ctx.world_size > 1:  # ZeRO over the job's training workers (rank / world size from placement)
            kw.update(rank=ctx.rank, world_size=ctx.world_size, store=ctx.store)
    else:
        kw = {"device": r.device}
        if ctx.world_size > 1:  # data-parallel: gradients averaged over the job's gloo group
            kw["group"] = ctx.group
    trainer = make_train_backend(
        r.train_backend, build_model(cfg.model, r.seed, TOK), lr=r.lr, max_grad_norm=r.max_grad_norm, **kw
    )
    dev = getattr(trainer, "device", "cpu")
    ref = build_model(cfg.model, r.seed, TOK).requires_grad_(False).to(dev) if r.kl_coef > 0 else None
    return {"trainer": trainer, "ref": ref, "step": 0}


def response_minimums(n: int, mean_tokens: int, cap: int, sigma: float, seed: int) -> torch.Tensor:
    """Per-response minimum lengths, LongTensor ``[n]``: log-normal with shape ``sigma`` and mean
    ``mean_tokens``, clipped to ``[1, cap]`` (a long tail of stragglers; RollMux Fig. 11)."""
    g = torch.Generator().manual_seed(int(seed) % (2**63 - 1))
    z = torch.randn(n, generator=g, dtype=torch.float64)
    lens = torch.exp(z * sigma + (torch.log(torch.tensor(float(mean_tokens), dtype=torch.float64)) - sigma * sigma / 2))
    return lens.round().clamp(1, cap).long()


def rollout_phase(cfg: GRPOJobConfig, state: dict, iteration: int, hook: Any = None) -> dict:
    """Rollout: sample ``num_prompts`` prompts, ``group_size`` responses each, score them.

    Returns samples ``{"seq": LongTensor[B, P+N], "prompt_len": P, "rewards": FloatTensor[B],
    "iteration", "policy_version", "reward_mean", "response_len_mean"}``, ``B = prompts x group``.
    """
    r = cfg.run
    torch.set_num_threads(r.threads)
    texts, answers = state["sampler"].sample(r.num_prompts)
    prompts = TOK.encode_batch(texts).repeat_interleave(r.group_size, dim=0)
    answers = answers.repeat_interleave(r.group_size, dim=0)
    seed = int(torch.randint(0, 2**62, (1,), generator=state["rng"]))
    progress: Optional[Callable[[int, int], None]] = getattr(hook, "progress", None)
    min_new: Any = r.min_new_tokens
    if r.response_tail_sigma > 0:  # long-tailed lengths, seeded from this call's seed
        min_new = response_minimums(prompts.shape[0], r.min_new_tokens, r.max_new_tokens, r.response_tail_sigma, seed)
    ctx = parallel("rollout")
    if ctx.world_size > 1:  # this rank's rows; its own sampling seed
        rows = ctx.shard(prompts.shape[0])
        prompts, answers = prompts[rows], answers[rows]
        if isinstance(min_new, torch.Tensor):
            min_new = min_new[rows]
        seed = (seed + ctx.rank * 0x9E3779B97F4A7C15) % 2**62
    seq = state["engine"].generate(
        prompts, max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=seed,
        eos_id=TOK.eos_id, pad_id=TOK.pad_id, progress=progress, min_new_tokens=min_new,
    )
    P = prompts.shape[1]
    rew = reward(seq[:, P:], answers, TOK)
    mask = algo.response_mask(seq, P, TOK.eos_id)
    return {
        "seq": seq, "prompt_len": P, "rewards": rew, "iteration": iteration,
        "policy_version": state["version"], "reward_mean": float(rew.mean()),
        "response_len_mean": float(mask.sum() / seq.shape[0]),
        "received_sha256": [state.get("received_sha256")],
    }


def gather_rollout(results: list[dict]) -> dict:
    """The rollout ranks' shards (rank order) as one batch: sequences (right-padded to the longest)
    and rewards concatenated, means recomputed over the batch, ``received_sha256`` one entry per
    rank (the weights each rollout worker applied last). Raises ValueError if the ranks' policy
    versions differ (a rank missed a sync)."""
    if len({x["policy_version"] for x in results}) != 1:
        raise ValueError(f"rollout ranks hold different policy versions: {[x['policy_version'] for x in results]}")
    from actors.backends import pad_to

    L = max(x["seq"].shape[1] for x in results)
    seq = torch.cat([pad_to(x["seq"], L, TOK.pad_id) for x in results])
    rew = torch.cat([x["rewards"] for x in results])
    P = results[0]["prompt_len"]
    mask = algo.response_mask(seq, P, TOK.eos_id)
    return {"seq": seq, "prompt_len": P, "rewards": rew, "iteration": results[0]["iteration"],
            "policy_version": results[0]["policy_version"], "reward_mean": float(rew.mean()),
            "response_len_mean": float(mask.sum() / seq.shape[0]),
            "received_sha256": [h for x in results for h in x["received_sha256"]]}


def gather_train(results: list[dict]) -> dict:
    """The training ranks' metrics (rank order): rank 0's, with the loss averaged over ranks.
    Raises ValueError when the ranks' weights differ (data parallelism broke)."""
    digests = {x["weights_sha256"] for x in results}
    if len(digests) != 1:
        raise ValueError(f"data-parallel training ranks ended with different weights: {sorted(digests)}")
    return {**results[0], "loss": sum(x["loss"] for x in results) / len(results), "dp_ranks": len(results)}


def train_phase(cfg: GRPOJobConfig, state: dict, samples: dict) -> dict:
    """Training: GRPO update on one rollout batch; returns metrics incl. the weights' digest.

    Raises:
        InjectedFailure: at iteration ``run.fail_in_train_at`` (failure-isolation demo).
    """
    r = cfg.run
    torch.set_num_threads(r.threads)
    if r.fail_in_train_at is not None and state["step"] == r.fail_in_train_at:
        raise InjectedFailure(f"{cfg.job.job_id}: injected failure in training phase at iteration {state['step']}")
    tr = state["trainer"]
    ctx = parallel("train")
    if ctx.world_size > 1 and getattr(tr, "name", "") == "torch":
        tr.group = ctx.group  # the job's process group (control plane, kept by the worker) for this step
    dev = getattr(tr, "device", "cpu")
    P = samples["prompt_len"]
    seq = samples["seq"].to(dev)
    mask = algo.response_mask(samples["seq"], P, TOK.eos_id).to(dev)
    adv = algo.group_advantages(samples["rewards"], r.group_size).to(dev)
    with torch.no_grad():
        old_logp = algo.token_logprobs(tr.forward(seq), seq)
        ref_logp = algo.token_logprobs(state["ref"](input_ids=seq).logits, seq) if state["ref"] is not None else None
    stats: dict[str, float] = {}
    losses = []
    B = seq.shape[0]
    for _ in range(r.ppo_epochs):
        for s in range(0, B, r.minibatch_size):
            mb = slice(s, min(B, s + r.minibatch_size))
            if ctx.world_size > 1:  # data-parallel: this rank's shard of the minibatch
                part = ctx.shard(mb.stop - mb.start)
                mb = slice(s + part.start, s + part.stop)
            logp = algo.token_logprobs(tr.forward(seq[mb]), seq[mb])
            loss, stats = algo.clipped_pg_loss(
                logp, old_logp[mb], adv[mb], mask[mb], r.clip_eps,
                ref_logp[mb] if ref_logp is not None else None, r.kl_coef,
            )
            losses.append(float(loss.detach()))
            stats["grad_norm"] = tr.backward_step(loss)
    state["step"] += 1
    return {
        "iteration": samples["iteration"], "step": state["step"], "loss": sum(losses) / len(losses),
        "reward_mean": samples["reward_mean"], "response_len_mean": samples["response_len_mean"],
        "weights_sha256": weights_digest(tr.weights()), "received_sha256": samples.get("received_sha256"), **stats,
    }


def publish_weights(cfg: GRPOJobConfig, state: dict) -> dict[str, torch.Tensor]:
    """Sync (send side): the trained policy's weights as CPU tensors."""
    return state["trainer"].weights()


def apply_weights(cfg: GRPOJobConfig, state: dict, weights: dict[str, torch.Tensor]) -> None:
    """Sync (receive side): install the weights into the rollout engine; bump the policy version;
    keep their SHA-256 (``received_sha256`` of the next rollout's samples)."""
    state["engine"].load_weights(weights)
    state["version"] += 1
    state["received_sha256"] = weights_digest(weights)


@dataclass
class GRPOJob:
    """A registered job and its decorated phase callables (``rollout(it)``, ``train(samples)``, ``publish()``)."""

    job: Any
    rollout: Callable
    train: Callable
    publish: Callable


def make_job(cfg: GRPOJobConfig, *, attach: Optional[bool] = None, **job_kw) -> GRPOJob:
    """Register the GRPO phases on a ``rollmux.Job`` (plain mode or attached to the scheduler).

    ``job_kw`` go to :class:`rollmux.Job` (``switch``, ``scheduler_name``, ``checkpoint_dir``, ...).
    """
    import rollmux

    job = rollmux.Job(cfg.job, attach=attach, **job_kw)
    rollout, train, publish = register_phases(job, sys.modules[__name__], cfg, gather_rollout=gather_rollout,
                                              gather_train=gather_train)
    return GRPOJob(job, rollout, train, publish)


def run_job(
    cfg: GRPOJobConfig,
    *,
    attach: Optional[bool] = None,
    on_iteration: Optional[Callable[[dict], None]] = None,
    ready: Optional[Callable[[], None]] = None,
    **job_kw,
) -> dict:
    """The user's RL loop (rollout -> training -> sync) through the phase API; an asynchronous
    job's rollout of the next iteration runs beside this one's training (:meth:`rollmux.Job.pipeline`).

    Returns ``{"job_id", "iterations", "history": [metrics...], "final_reward", "initial_reward",
    "weights_sha256", "wall_s", "mode", "timeline", "info"}``; ``final_reward`` is the mean rollout reward of the last
    ``max(1, iterations // 5)`` iterations. Exceptions inside a phase propagate (the job is
    reported failed by the phase API). ``ready()`` is called once the job exists (admitted, in
    scheduled mode) and before its first phase, e.g. to wait for group-mates to be admitted.
    """
    g = make_job(cfg, attach=attach, **job_kw)
    if ready is not None:
        try:
            ready()
        except BaseException as e:
            g.job.fail(e)
            raise
    history: list[dict] = []
    t0 = time.perf_counter()
    with g.job:  # an asynchronous job (job.max_staleness k >= 1) runs up to k rollouts ahead
        for it, samples in g.job.pipeline(g.rollout, range(cfg.run.iterations)):
            metrics = g.train(samples)
            g.publish()
            history.append(metrics)
            if on_iteration:
                on_iteration(metrics)
    k = max(1, len(history) // 5)
    return {
        "job_id": cfg.job.job_id,
        "iterations": len(history),
        "history": history,
        "final_reward": sum(m["reward_mean"] for m in history[-k:]) / k,
        "initial_reward": sum(m["reward_mean"] for m in history[:k]) / k,
        "weights_sha256": history[-1]["weights_sha256"] if history else None,
        "wall_s": time.perf_counter() - t0,
        "mode": g.job.mode,
        "timeline": g.job.timeline,
        "info": g.job.info,
    }


def run_coexecuted(cfgs: list[GRPOJobConfig], scheduler_name: str, *, admit_timeout_s: float,
                   finish_timeout_s: float, **job_kw) -> dict[str, Any]:
    """Run ``cfgs`` attached to the scheduler ``scheduler_name``: admitted one after another in
    list order (so Alg. 1's online packing is deterministic), then started together by a barrier.

    ``job_kw`` go to every job's :class:`rollmux.Job` (e.g. ``sync_backend``).
    Returns ``{job_id: run_job result, or the exception that job raised}``.
    Raises TimeoutError when a job is not admitted within ``admit_timeout_s`` or the jobs do not
    finish within ``finish_timeout_s`` (seconds each).
    """
    import threading

    results: dict[str, Any] = {}
    barrier = threading.Barrier(len(cfgs), timeout=admit_timeout_s)
    admitted = [threading.Event() for _ in cfgs]

    def go(i: int, cfg: GRPOJobConfig) -> None:
        def ready() -> None:
            admitted[i].set()
            barrier.wait()

        try:
            results[cfg.job.job_id] = run_job(cfg, attach=True, scheduler_name=scheduler_name, ready=ready, **job_kw)
        except BaseException as e:  # returned to the caller
            results[cfg.job.job_id] = e
            admitted[i].set()
            barrier.abort()

    threads = []
    for i, c in enumerate(cfgs):
        threads.append(threading.Thread(target=go, args=(i, c)))
        threads[-1].start()
        if not admitted[i].wait(admit_timeout_s):
            barrier.abort()
            raise TimeoutError(f"{c.job.job_id} was not admitted within {admit_timeout_s:g} s")
    for t in threads:
        t.join(timeout=finish_timeout_s)
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"co-executed jobs did not finish within {finish_timeout_s:g} s")
    return results
