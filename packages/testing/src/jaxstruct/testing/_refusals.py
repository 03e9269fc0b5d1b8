"""Which exceptions at construction are refusals of a draw, and a tally of them per test.

``structs()`` discards a draw only when the class refused it on purpose: a
``ValidationError`` (what validators returning ``False``, static-field checks
and type checks raise, and what ``__post_init__`` should raise to refuse), or
a ``ValueError``/``AssertionError`` raised by a validator or ``__check_init__``
itself, or a ``ValueError``/``TypeError`` raised by a converter itself (the
documented ways for them to say no). Anything else (an ``IndexError`` in
``__post_init__``, an error raised deep inside a library a check calls) is a
bug of the class under test and fails the test, as ``st.builds`` would. Which
check refused comes from core (``jaxstruct.core.refusal_of``), never from the
wording of its messages.

The tally counts, per class, the instances ``structs()`` tried to build and
those refused, so that the pytest plugin can report, at the end of each test,
a class that refuses a large share of its draws (:class:`RefusalWarning`): an
over-strict check otherwise passes silently, its refusals discarded.

A second tally counts the values refused *field by field* (a validator
filtering one field's draws, a shape an earlier field's sizes rule out): no
instance is lost to them, so they are no :class:`RefusalWarning`, but when
they are what made Hypothesis give up (``filter_too_much``), the health
check's note names the class, the field and the check, from this tally.

Kept free of JAX and Hypothesis imports: the pytest plugin reads the tally.
"""

from __future__ import annotations

import contextvars
import inspect
from collections import Counter
from types import CodeType
from typing import Any

__all__ = [
    "REPORTED_SHARE",
    "RefusalWarning",
    "describe_refusal",
    "drawing_field",
    "health_note",
    "record_attempt",
    "record_field_refusal",
    "record_refusal",
    "refusal_report",
    "reset_refusals",
]

#: Refusals since the current test started: (class name, summary) -> count.
_TALLY: Counter[tuple[str, str]] = Counter()
#: Instances ``structs()`` tried to build since the current test started, per class name.
_ATTEMPTS: Counter[str] = Counter()
#: Values refused field by field since the current test started: (class name, summary) -> count.
_FIELD_TALLY: Counter[tuple[str, str]] = Counter()

#: The class and field whose value is being drawn (for refusals deep inside the draw).
drawing_field: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "jaxstruct_testing_field", default=None
)

#: A class refusing more than this share of its draws in a test is reported (however
#: few: one refusal of a three-value space, exhausted by Hypothesis, is a valid value lost).
REPORTED_SHARE = 0.10

_HOOK_REFUSALS = (ValueError, AssertionError)
_CONVERTER_REFUSALS = (ValueError, TypeError)
_LONGEST = 160


class RefusalWarning(UserWarning):
    """A struct class refused a large share of the draws of ``structs()`` in one test.

    Raised as a warning at the end of the test (pytest shows it in the
    warnings summary, also when the test passes); under ``-W error`` it fails
    the test. The refused draws were discarded, so the test checked fewer
    instances than it seems, and a check refusing valid values (an over-strict
    ``__post_init__``) goes unnoticed otherwise.
    """


def _code_of(fn: Any) -> CodeType | None:
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(vars(type(fn)).get("__call__"), "__code__", None)
    return code if isinstance(code, CodeType) else None


def _raised_in(err: BaseException) -> CodeType | None:
    """The code object of the Python frame that raised ``err``."""
    tb = err.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _LONGEST else text[: _LONGEST - 3] + "..."


def describe_refusal(cls: type, err: BaseException) -> str | None:
    """Describe ``err`` as ``"Class.field: why"`` when it is a deliberate refusal, else ``None``.

    Example:
        >>> import jaxstruct.core as js
        >>> class P(js.Struct):
        ...     n: int = js.field(validator=lambda n: n > 0)
        >>> try:
        ...     P(n=0)
        ... except Exception as err:
        ...     print(describe_refusal(P, err))  # doctest: +ELLIPSIS
        P.n: validator '...<lambda>' rejected 0
        >>> describe_refusal(P, IndexError("a bug"))
    """
    from jaxstruct.core import ValidationError, refusal_of

    refusal = refusal_of(err)
    if refusal is None:
        if isinstance(err, ValidationError):  # raised by a user's own code, outside a hook
            return _short(f"{cls.__qualname__}: ValidationError: {err}")
        return None
    where = refusal.cls.__qualname__
    if refusal.field is not None:
        where += f".{refusal.field}"
    summary = _short(f"{where}: {refusal.reason}")
    if isinstance(err, ValidationError):
        return summary
    if refusal.cls is not cls:
        return None  # another class's converter or check failed inside this one: a bug
    if refusal.check == "converter" and isinstance(err, _CONVERTER_REFUSALS):
        return summary
    if refusal.check in ("validator", "check_init") and isinstance(err, _HOOK_REFUSALS):
        # Raised by the hook itself, not deep inside a library it calls.
        code = _raised_in(err)
        if code is not None and code is _code_of(refusal.hook):
            return summary
    return None


def record_refusal(cls: type, summary: str) -> None:
    """Count a refusal of a draw of ``cls`` for the health-check note of the running test."""
    _TALLY[(cls.__qualname__, summary)] += 1


def record_field_refusal(reason: str, where: tuple[str, str] | None = None) -> str:
    """Count a value refused for one field (``where``: class and field names; default: the
    field being drawn); return the summary ``"Class.field: reason"`` it is counted under."""
    where = where or drawing_field.get()
    if where is None:
        summary = _short(reason)
        _FIELD_TALLY[("", summary)] += 1
        return summary
    summary = _short(f"{where[0]}.{where[1]}: {reason}")
    _FIELD_TALLY[(where[0], summary)] += 1
    return summary


def record_attempt(cls: type) -> None:
    """Count an instance of ``cls`` that ``structs()`` tries to build in the running test."""
    _ATTEMPTS[cls.__qualname__] += 1


def reset_refusals() -> None:
    """Forget the draws and refusals counted so far (a new test starts)."""
    _TALLY.clear()
    _ATTEMPTS.clear()
    _FIELD_TALLY.clear()


def _reasons(name: str, top: int) -> list[tuple[str, int]]:
    return [(why, n) for (cls, why), n in _TALLY.most_common() if cls == name][:top]


def refusal_report(top: int = 3) -> str | None:
    """Name each class that refused over :data:`REPORTED_SHARE` of its draws, or ``None``.

    Example:
        >>> reset_refusals()
        >>> class Cfg:
        ...     pass
        >>> for n in range(20):
        ...     record_attempt(Cfg)
        ...     if n % 4 == 0:
        ...         record_refusal(Cfg, "Cfg: Cfg.__post_init__ raised ValidationError: n == 1")
        >>> print(refusal_report())  # doctest: +NORMALIZE_WHITESPACE
        jaxstruct.testing: structs() discarded a large share of the draws its classes refused
        (over 10%; each discarded draw is an instance the test never saw):
          Cfg refused 5 of 20 draws (25%), most often
            5x Cfg: Cfg.__post_init__ raised ValidationError: n == 1
        Fix the check if it refuses valid values; else draw valid values (an override,
        bounds on the field) so that fewer are thrown away.
        >>> reset_refusals()
    """
    per_class: Counter[str] = Counter()
    for (name, _), count in _TALLY.items():
        per_class[name] += count
    lines = []
    for name, refused in per_class.most_common():
        tried = max(_ATTEMPTS[name], refused)
        if refused <= REPORTED_SHARE * tried:
            continue
        lines.append(
            f"  {name} refused {refused} of {tried} draws ({refused / tried:.0%}), most often"
        )
        lines += [f"    {n}x {why}" for why, n in _reasons(name, top)]
    if not lines:
        return None
    return "\n".join(
        [
            "jaxstruct.testing: structs() discarded a large share of the draws its classes "
            f"refused\n(over {REPORTED_SHARE:.0%}; each discarded draw is an instance the test "
            "never saw):",
            *lines,
            "Fix the check if it refuses valid values; else draw valid values (an override,\n"
            "bounds on the field) so that fewer are thrown away.",
        ]
    )


def health_note(top: int = 3) -> str | None:
    """A note naming the classes whose draws were refused most, with their reasons, or ``None``.

    Whole instances refused at construction come first, then values refused
    field by field (each naming the class, the field and the check).

    Example:
        >>> reset_refusals()
        >>> class Cfg:
        ...     pass
        >>> for _ in range(3):
        ...     record_refusal(Cfg, "Cfg.n: validator 'positive' rejected 0")
        >>> _ = record_field_refusal("validator 'finite' rejected float32[3]", ("Cfg", "w"))
        >>> print(health_note())
        jaxstruct.testing: structs() discarded draws its classes refused: Cfg 3 times, most often
          3x Cfg.n: validator 'positive' rejected 0
        and values its fields refused: Cfg 1 times, most often
          1x Cfg.w: validator 'finite' rejected float32[3]
        >>> reset_refusals()
    """
    parts = []
    if _TALLY:
        parts.append(
            "jaxstruct.testing: structs() discarded draws its classes refused: "
            + _summary(_TALLY, top)
        )
    if _FIELD_TALLY:
        head = (
            "and values its fields refused: "
            if parts
            else "jaxstruct.testing: structs() discarded values its fields refused: "
        )
        parts.append(head + _summary(_FIELD_TALLY, top))
    return "\n".join(parts) if parts else None


def _summary(tally: Counter[tuple[str, str]], top: int) -> str:
    per_class: Counter[str] = Counter()
    for (name, _), count in tally.items():
        per_class[name] += count
    lines = []
    for name, total in per_class.most_common(top):
        reasons = [(why, n) for (cls, why), n in tally.most_common() if cls == name][:top]
        lines.append(f"{name or 'arrays()'} {total} times, most often")
        lines += [f"  {n}x {why}" for why, n in reasons]
    return "\n".join(lines)
