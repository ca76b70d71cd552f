import torch
import rollmux

job = rollmux.Job({"job_id": "bandit", "model_params_b": 0.001, "num_prompts": 64, "max_response_tokens": 1,
                   "num_rollout_gpus": 1, "num_train_gpus": 1, "slo": 2.0})  # SLO: <= 2x its solo time
PAYOFF = torch.tensor([0.1, 0.2, 0.9, 0.3])               # a 4-armed bandit: arm 2 pays best

@job.state("rollout")                                     # built once where the phase runs, kept in host memory
def rollout_state(): return {"logits": torch.zeros(4), "gen": torch.Generator().manual_seed(0)}
@job.state("train")
def train_state(): return {"logits": torch.zeros(4, requires_grad=True)}

@job.phase("rollout")                                     # on the job's rollout nodes, under a permit
def rollout(state, iteration):
    arms = torch.multinomial(state["logits"].softmax(0), 64, replacement=True, generator=state["gen"])
    return arms, PAYOFF[arms]
@job.phase("train")                                       # on its training nodes: one REINFORCE step
def train(state, batch):
    arms, reward = batch
    loss = -((reward - reward.mean()) * state["logits"].log_softmax(0)[arms]).mean()
    loss.backward()
    with torch.no_grad():
        state["logits"] -= state["logits"].grad; state["logits"].grad = None
    return reward.mean().item()
@job.phase("sync")                                        # training -> rollout weights
def publish(state): return {"logits": state["logits"].detach().clone()}
@job.apply_weights
def apply(state, weights): state["logits"] = weights["logits"]

if __name__ == "__main__":
    with job:                                             # solo here; co-executed under `ray job submit` (below)
        for it in range(30):
            mean_reward = train(rollout(it)); publish()
    print(f"mean reward after 30 iterations: {mean_reward:.2f}")
