"""planner/errors.py: the exit code each error a part raises ends a command with, and the
typed bad-input errors of every part as one family (UserError)."""
import json

import pytest
from pydantic import BaseModel, ValidationError

from planner.errors import (EXIT_BAD_INPUT, EXIT_NO_PLAN, Unplannable, UserError, exit_code,
                            is_user_error, one_line)


def _user_error_types():
    from api.storage.sqlite_store import DamagedDatabase
    from api.stragglers import SpeedError
    from planner.failures import FailedSetError
    from planner.inputs.limits import TooLarge
    from planner.interop.csv_import import CsvImportError
    from planner.interop.pipelining_csv import ExportError
    from planner.simulation.trace import TraceError
    from planner.solvers.backends import UnknownBackend
    from planner.validate import InvalidPlan
    from executor.checkpoint.manifest import CheckpointError
    from executor.node.agent import AgentError
    from executor.runtime.transport.wire import ActivationSpecError
    return [DamagedDatabase, SpeedError, FailedSetError, TooLarge, CsvImportError,
            ExportError, TraceError, UnknownBackend, InvalidPlan, CheckpointError,
            AgentError, ActivationSpecError]


def test_every_parts_bad_input_error_is_a_user_error_with_exit_code_2():
    for cls in _user_error_types():
        assert issubclass(cls, UserError) and issubclass(cls, ValueError), cls
        assert exit_code(cls("x")) == EXIT_BAD_INPUT


def test_no_plan_is_exit_3_and_a_bug_is_not_a_user_error():
    from planner.control.roles import NoRolesError
    from planner.failures import NoPlanError
    assert exit_code(NoPlanError(1)) == exit_code(NoRolesError("x")) == EXIT_NO_PLAN
    assert issubclass(NoPlanError, Unplannable) and not issubclass(NoPlanError, ValueError)
    with pytest.raises(TypeError):
        exit_code(KeyError("a bug"))
    assert not is_user_error(AttributeError("a bug")) and is_user_error(OSError("disk"))


def test_one_line_of_validation_json_and_file_errors():
    class M(BaseModel):
        n: int

    with pytest.raises(ValidationError) as ve:
        M.model_validate({"n": "x", "m": 1})
    assert one_line(ve.value, "spec").startswith("bad spec: n: ")
    assert exit_code(ve.value) == EXIT_BAD_INPUT
    with pytest.raises(json.JSONDecodeError) as je:
        json.loads("{\n]")
    assert one_line(je.value) == "bad input: malformed JSON at line 2 column 1"
    with pytest.raises(FileNotFoundError) as fe:
        open("/nonexistent/x")
    assert one_line(fe.value) == "no such file: /nonexistent/x"
    assert one_line(UserError("first\nsecond")) == "first"
