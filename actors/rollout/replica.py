"""One engine replica of the rollout service: an actor around a :class:`actors.rollout.engine.CPUEngine`.

The service's serving loop for this replica (``actors/rollout/service.py``) owns the scheduler;
each :meth:`EngineReplica.window` call is the engine side of one serving window
(:class:`actors.rollout.window.LocalWindowEngine`, the same code the in-process loop runs): load
new weights first when the call carries them (the engine drops its prefix KV, made by the old
weights, and reports the digest of what it serves now), stop aborted requests (their KV freed
before the batch starts), start the batch, run one time slice (``slice_tokens`` decode steps per
running generation) and report what finished, with the weights version of every token. Requests
that asked for them get the log-probability of each sampled token.

Weights also arrive over the topology-aware sync plan (:meth:`EngineReplica.receive_sync`: this
replica is rollout worker ``j`` of the plan; the received tensors wait, staged, until a window
installs them) and leave as a safetensors file (:meth:`EngineReplica.export_weights`). With
``service.engine: vllm`` a :class:`actors.rollout.vllm_engine.VLLMEngine` takes the same place
(weights through vLLM's in-place reload, per-token versions; no token log-probs), its KV cache
sized to the scheduler's ``kv_capacity_tokens`` and its context to ``context_tokens``.
"""

from __future__ import annotations

from typing import Any, Optional

from actors.rollout.engine import CPUEngine
from actors.rollout.window import LocalWindowEngine
from rollmux.rollout_sched.api import WindowCall, WindowReply
from rollmux.rollout_sched.weights import SyncOffer, SyncReceipt, TensorSpec, WeightsLoad


class EngineReplica:
    """Actor body of one replica. ``config``: the section's ``RolloutSchedConfig`` as a dict."""

    def __init__(self, index: int, config: dict, seed: int = 0):
        from rollmux.rollout_sched import RolloutSchedConfig

        cfg = RolloutSchedConfig.model_validate(config)
        self.index = index
        if cfg.service.engine == "vllm":  # vLLM's CPU build or CUDA (no token log-probs from this adapter)
            from actors.rollout.vllm_engine import VLLMEngine

            self.engine: Any = VLLMEngine(cfg.service.vllm_model, slice_steps=cfg.slice_tokens, seed=seed,
                                          kv_capacity_tokens=cfg.budget.kv_capacity_tokens,
                                          max_model_len=cfg.service.context_tokens)
            self.local = LocalWindowEngine(self.engine, resolve=self._resolve)
        else:
            self.engine = CPUEngine(vocab_size=cfg.coldstart.vocab_size, max_positions=cfg.service.context_tokens,
                                    slice_tokens=cfg.slice_tokens, seed=seed, num_threads=cfg.service.engine_threads,
                                    block_tokens=cfg.prefix_block_tokens)
            self.local = LocalWindowEngine(self.engine, logprob_hooks=(self.engine.want_logprobs,
                                                                       self.engine.take_logprobs),
                                           resolve=self._resolve)
        self._staged: Optional[tuple[int, dict]] = None  # (version, tensors) received over a sync plan
        self._endpoints: dict[str, Any] = {}

    def ping(self) -> int:
        return self.index

    def window(self, call: WindowCall) -> WindowReply:
        return self.local.run(call)

    def manifest(self) -> Optional[list[TensorSpec]]:
        """Name, dtype and shape of every tensor the engine serves (what an update must match;
        None: the engine does not know them)."""
        return self.engine.manifest()

    def weights_sha256(self) -> Optional[str]:
        return self.engine.weights_sha256()

    # ------------------------------------------------------------------ weights over a sync plan
    def _resolve(self, load: WeightsLoad) -> Any:
        """The tensors of ``load``: the staged ones of a sync-plan version (a load without bytes),
        else its file decoded."""
        from actors.rollout.weights import decode

        if not load.data:
            if self._staged is None or self._staged[0] != load.version:
                raise ValueError(f"weights: version {load.version} was announced as staged, but this replica "
                                 f"holds {None if self._staged is None else self._staged[0]}")
            tensors = self._staged[1]
            self._staged = None
            return tensors
        return decode(load)

    def receive_sync(self, offer: SyncOffer) -> SyncReceipt:
        """Receive ``offer.version`` as rollout worker ``offer.rollout_index`` of its plan (all or
        nothing: a failed transfer raises and leaves nothing staged); the tensors wait, staged,
        until a window installs them. Windows of this replica wait while it receives."""
        import time

        import torch

        from actors.rollout.weights import state_digest
        from collectives import open_endpoint

        t0 = time.perf_counter()
        key = f"{offer.job_id}/{offer.plan.digest()}"
        ep = self._endpoints.get(key)
        if ep is None or ep.broken:
            for old in self._endpoints.values():
                old.close()
            self._endpoints = {}
            ep = open_endpoint(offer.plan, "rollout", offer.rollout_index, backend=offer.backend, addr=offer.addr,
                               job_id=offer.job_id, timeout_s=offer.timeout_s, bind_host=offer.bind_host)
            self._endpoints[key] = ep
        specs = self.engine.manifest()
        if specs is None:
            raise ValueError("plan: this engine does not know its tensors (a model named on a hub): no sync plan")
        tensors = ep.receive({s.name: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device="meta") for s in specs})
        self._staged = (offer.version, tensors)
        return SyncReceipt(rollout_index=offer.rollout_index, version=offer.version, sha256=state_digest(tensors),
                           received_bytes=sum(int(t.numel()) * int(t.element_size()) for t in tensors.values()),
                           recv_s=time.perf_counter() - t0)

    def export_weights(self, version: int) -> WeightsLoad:
        """The staged sync-plan version ``version`` (else the weights served, CPU engine) as a
        complete load. Raises ValueError when neither is here."""
        from actors.rollout.weights import encode, state_digest

        if self._staged is not None and self._staged[0] == version:
            sd = self._staged[1]
        elif isinstance(self.engine, CPUEngine):
            sd = self.engine.model.state_dict()
        else:
            raise ValueError(f"version: {version} is not staged on replica {self.index}")
        return WeightsLoad(version=version, sha256=state_digest(sd), data=encode(sd), source="sync")
