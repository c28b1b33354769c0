"""What a process boundary costs a Python environment: `stepwise.play` and Monte Carlo
`stepwise.label_actions` (forks) with a tiny environment (a walk up three rungs) in process and behind
`stepwise.isolated` (each object in a process of its own, forked by the forkserver and reused).
The environment does next to nothing, so the difference is the boundary's own cost.

    python bench/agent_isolated.py [--problems 8] [--n 2] [--rollouts 2] [--repeat 3]
"""

import argparse
import json
import random
import time

import stepwise


class Walk:
    """A walk on a line: `up` moves one rung up, `fall` ends it lost, three rungs win; it forks
    by copying its height."""

    def reset(self, problem):
        self.height = 0
        return "at the bottom"

    def step(self, action):
        self.height += action == "up"
        lost = action == "fall"
        won = self.height >= 3 and not lost
        return ("fell" if lost else f"at rung {self.height}"), lost or won, won

    def fork(self):
        other = Walk()
        other.height = self.height
        return other


class Climber:
    def continue_from(self, question, prefix, n, until, seed):
        return [random.Random(seed * 31 + j + len(prefix)).choice(["up", "wait", "fall"]) for j in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    probs = [{"id": f"c{i}", "question": "Climb three rungs."} for i in range(args.problems)]
    result = {}
    for name, env in [("in_process", Walk), ("isolated", stepwise.isolated(Walk))]:
        plays, labels = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            trajs = stepwise.play(probs, Climber(), env=env, n=args.n, max_actions=8, seed=1, progress=False)
            plays.append(time.perf_counter() - start)
            start = time.perf_counter()
            stepwise.label_actions(trajs, probs, method="mc", env=env, policy=Climber(), rollouts=args.rollouts,
                                   progress=False)
            labels.append(time.perf_counter() - start)
        result[name] = {"play_seconds": [round(x, 3) for x in plays], "mc_label_seconds": [round(x, 3) for x in labels],
                        "trajectories": len(trajs), "actions": sum(len(t["steps"]) for t in trajs)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
