"""TextWorld games as stepwise environments: games generated locally, played and labelled.

Needs the `textworld` package (``pip install textworld``; Linux and macOS). Games are made by
TextWorld's own generator and compiled to ``.z8`` files; a problem names its file in
``meta.game``, so trajectory files can be replayed anywhere the games are.

>>> import stepwise, stepwise.textworld as tw
>>> games = tw.make_games(4, seed=1, folder="tw_games")
>>> trajs = stepwise.play(games, policy, env=tw.Game, n=4)
>>> labelled = stepwise.label_actions(trajs, games, method="mc", env=tw.Game, policy=policy)
>>> oracle = stepwise.label_actions(trajs, games, method="oracle", env=tw.Game)

`Game` is the environment: ``reset(problem)`` starts the problem's game, ``step(action)`` plays
one command and answers ``(observation, done, won)``, ``judge(action)`` is an oracle built on
TextWorld's walkthrough (``policy_commands``): an action that shortens the walkthrough is
progress, one that leaves it as long is useless (or invalid, when the game did not understand
it), one that lengthens it regresses, one that loses the game ruins it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["Game", "make_games"]


def _textworld():
    try:
        import textworld  # type: ignore[import-not-found]
    except ImportError as e:  # pragma: no cover - exercised where textworld is missing
        raise ImportError("stepwise.textworld needs TextWorld: pip install textworld") from e
    return textworld


def _clean(feedback: str) -> str:
    """TextWorld's feedback without its banner art, prompt and runs of blank lines."""
    text = re.sub(r"[ \t]+\n", "\n", feedback.replace(">", " ")).strip()
    return re.sub(r"\n{3,}", "\n\n", text)


def make_games(
    count: int,
    seed: int = 0,
    folder: str = "textworld_games",
    rooms: int = 3,
    objects: int = 6,
    quest_length: int = 3,
) -> List[Dict[str, Any]]:
    """Generate `count` TextWorld games (each compiled once; a game already in `folder` is
    reused) and return them as problems: the objective as the question, the game file in
    ``meta.game``, the expert's commands (TextWorld's walkthrough) in
    ``meta.walkthrough_commands``."""
    textworld = _textworld()
    os.makedirs(folder, exist_ok=True)
    problems = []
    for i in range(count):
        path = os.path.join(folder, f"tw-{seed}-{i}.z8")
        opts = textworld.GameOptions()
        opts.seeds = seed * 100_003 + i
        opts.nb_rooms = rooms
        opts.nb_objects = objects
        opts.quest_length = quest_length
        opts.path = path
        opts.force_recompile = False
        game_file, game = textworld.make(opts)
        problems.append(
            {
                "id": f"tw-{seed}-{i}",
                "question": game.objective,
                "source": "textworld",
                "meta": {"game": os.path.abspath(game_file), "walkthrough_commands": list(game.walkthrough or [])},
            }
        )
    return problems


class Game:
    """One TextWorld game in play (the environment `stepwise.play` and `label_actions` take)."""

    def __init__(self) -> None:
        self._env: Any = None
        self._problem: Optional[Dict[str, Any]] = None
        self._actions: List[str] = []
        self._walkthrough: List[str] = []
        self._over = False

    def _start(self, problem: Dict[str, Any]) -> str:
        textworld = _textworld()
        infos = textworld.EnvInfos(won=True, lost=True, policy_commands=True)
        self._env = textworld.start(problem["meta"]["game"], request_infos=infos)
        state = self._env.reset()
        self._problem, self._actions, self._over = problem, [], False
        self._walkthrough = list(state.policy_commands or [])
        return _clean(state.feedback)

    def reset(self, problem: Dict[str, Any]) -> str:
        if "game" not in problem.get("meta", {}):
            raise ValueError(f"problem {problem.get('id')!r} has no meta.game (make it with make_games)")
        return self._start(problem)

    def step(self, action: str) -> Tuple[str, bool, bool]:
        state, _score, done = self._env.step(action)
        self._actions.append(action)
        self._walkthrough = list(state.policy_commands or [])
        self._over = bool(done)
        return _clean(state.feedback), bool(done), bool(state.won)

    def fork(self) -> "Game":
        other = Game()
        other._start(self._problem)  # type: ignore[arg-type]
        for a in self._actions:
            other.step(a)
        return other

    def judge(self, action: str) -> str:
        before = len(self._walkthrough)
        other = self.fork()
        feedback, done, won = other.step(action)
        after = len(other._walkthrough)
        if won:
            return "progress"
        if done:
            return "ruin"
        if after < before:
            return "progress"
        if after > before:
            return "regress"
        understood = not re.search(r"(?i)that's not a verb|you can't see|i didn't understand|not something you can", feedback)
        return "useless" if understood else "invalid"
