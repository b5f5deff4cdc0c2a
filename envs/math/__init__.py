"""Math system environment: data loaders, the answer grader, the ``math`` env and a generated CPU-scale task.

Importing this package registers the ``math`` environment (``envs.make_env("math")``). It imports only the
standard library and numpy; math-verify runs in grader subprocesses, ``datasets`` only in the hub download.
"""
from envs.math.data import MATH_SETS, PAPER_TEST_SETS, PAPER_TRAIN_SETS, load_benchmark, load_prepared
from envs.math.env import MathEnv
from envs.math.generated import generate_tasks
from envs.math.answers import extract_boxed
from envs.math.grader import GraderStats, MathGrader, default_grader, grade_batch

__all__ = [
    "MATH_SETS", "PAPER_TEST_SETS", "PAPER_TRAIN_SETS", "GraderStats", "MathEnv", "MathGrader",
    "default_grader", "extract_boxed", "generate_tasks", "grade_batch", "load_benchmark", "load_prepared",
]
