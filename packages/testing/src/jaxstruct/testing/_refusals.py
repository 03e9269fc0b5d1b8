"""Which exceptions at construction are refusals of a draw, and a tally of them per test.

``structs()`` discards a draw only when the class refused it on purpose: a
``ValidationError`` (what validators returning ``False``, static-field checks
and type checks raise, and what ``__post_init__`` should raise to refuse), or
a ``ValueError``/``AssertionError`` raised by a validator or ``__check_init__``
itself, or a ``ValueError``/``TypeError`` raised by a converter itself (the
documented ways for them to say no). Anything else (an ``IndexError`` in
``__post_init__``, an error raised deep inside a library a check calls) is a
bug of the class under test and fails the test, as ``st.builds`` would.

Kept free of JAX and Hypothesis imports: the pytest plugin reads the tally.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

__all__ = ["describe_refusal", "health_note", "record_refusal", "reset_refusals"]

#: Refusals since the current test started: (class name, summary) -> count.
_TALLY: Counter[tuple[str, str]] = Counter()

_HOOK_REFUSALS = (ValueError, AssertionError)
_CONVERTER_REFUSALS = (ValueError, TypeError)
_LONGEST = 160


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


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and its causes (a converter's error is re-raised naming the field)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def _hooks(cls: type) -> list[tuple[Callable[..., Any], str]]:
    """The validators and ``__check_init__`` methods of ``cls``, each with a label."""
    import jaxstruct.core as js

    found: list[tuple[Callable[..., Any], str]] = []
    for name, spec in js.fields(cls).items():
        for validator in spec.validators:
            found.append((validator, f"{cls.__qualname__}.{name}: validator {_name(validator)!r}"))
    for check in getattr(cls.__dict__.get("__struct_layout__"), "checks", ()):
        found.append((check, f"{cls.__qualname__}: {_name(check)}"))
    return found


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


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
    from jaxstruct.core import ValidationError

    if isinstance(err, ValidationError):
        # Core's messages name class and field, then "; " and the fix.
        return _short(str(err).split("; ")[0])
    if isinstance(err, _CONVERTER_REFUSALS):
        # Core re-raises a converter's error naming "Class.field: converter f raised ...",
        # or adds the note "while converting Class.field with f".
        texts = [str(err), *getattr(err, "__notes__", ())]
        for text in texts:
            if text.startswith(f"{cls.__qualname__}.") and ": converter " in text:
                return _short(text.split("; pass a value")[0])
            if text.startswith(f"while converting {cls.__qualname__}."):
                return _short(f"{text[len('while converting ') :]}: {type(err).__name__}: {err}")
    for link in _chain(err):
        code = _raised_in(link)
        for fn, label in _hooks(cls):
            if isinstance(link, _HOOK_REFUSALS) and code is not None and code is _code_of(fn):
                return _short(f"{label} raised {type(link).__name__}: {link}")
    return None


def record_refusal(cls: type, summary: str) -> None:
    """Count a refusal of a draw of ``cls`` for the health-check note of the running test."""
    _TALLY[(cls.__qualname__, summary)] += 1


def reset_refusals() -> None:
    """Forget the refusals counted so far (a new test starts)."""
    _TALLY.clear()


def health_note(top: int = 3) -> str | None:
    """A note naming the classes whose draws were refused most, with their reasons, or ``None``.

    Example:
        >>> reset_refusals()
        >>> class Cfg:
        ...     pass
        >>> for _ in range(3):
        ...     record_refusal(Cfg, "Cfg.n: validator 'positive' rejected 0")
        >>> print(health_note())
        jaxstruct.testing: structs() discarded draws its classes refused: Cfg 3 times, most often
          3x Cfg.n: validator 'positive' rejected 0
        >>> reset_refusals()
    """
    if not _TALLY:
        return None
    per_class: Counter[str] = Counter()
    for (name, _), count in _TALLY.items():
        per_class[name] += count
    lines = []
    for name, total in per_class.most_common(top):
        reasons = [(why, n) for (cls, why), n in _TALLY.most_common() if cls == name][:top]
        lines.append(f"{name} {total} times, most often")
        lines += [f"  {n}x {why}" for why, n in reasons]
    return "jaxstruct.testing: structs() discarded draws its classes refused: " + "\n".join(lines)
