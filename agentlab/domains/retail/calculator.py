"""tau2's ``calculate`` tool's arithmetic, without ``eval``: :func:`calculate_expression`.

tau2 evaluates the expression with Python's ``eval`` after checking its characters; the port walks the
parsed expression tree (numbers, ``+ - * / // **``, unary signs, parentheses) and gets the same value
and the same text (``str(round(float(x), 2))``), refusing a power over :data:`MAX_POWER_BITS` bits that
tau2 would spend minutes on. A refusal is a :class:`~agentlab.ToolError` (``invalid_arguments``).
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from agentlab.core.errors import Category, ToolError

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_POWER_BITS = 100_000  # refuse ints such as 9**9**9 that tau2's eval would spend minutes on


def _evaluate(node: ast.AST) -> Any:
    """The value Python's ``eval`` gives an arithmetic expression tree, without ``eval``."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) \
                and abs(left) > 1 and right * math.log2(abs(left)) > MAX_POWER_BITS:
            raise OverflowError("result too large")
        return _BINARY[type(node.op)](left, right)
    raise TypeError("not an arithmetic expression")


def calculate_expression(expression: str) -> str:
    """tau2's ``calculate``: the characters it allows, Python's arithmetic, ``str(round(float(x), 2))``."""
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ToolError("Invalid characters in expression", Category.INVALID_ARGUMENTS)
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
        return str(round(float(value), 2))
    except ArithmeticError as exc:  # "division by zero", as tau2 says it
        raise ToolError(str(exc), Category.INVALID_ARGUMENTS) from None
    except (SyntaxError, TypeError, ValueError):
        raise ToolError("Invalid expression: use numbers, + - * /, parentheses and spaces",
                        Category.INVALID_ARGUMENTS) from None
