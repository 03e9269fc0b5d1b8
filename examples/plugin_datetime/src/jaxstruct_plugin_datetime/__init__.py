"""Codecs for ``datetime`` and ``decimal`` values, provided as a ``jaxstruct.io`` plugin."""

from __future__ import annotations

import datetime as dt
import decimal
import zoneinfo
from typing import Any

from jaxstruct.io import Codec, hookimpl
from jaxstruct.registry import SerializationError

__all__ = ["CODECS", "JAXSTRUCT_IO_PLUGIN_API", "jaxstruct_register_codecs"]

#: The jaxstruct.io plugin interface this plugin is written for.
JAXSTRUCT_IO_PLUGIN_API = 1


def _tz_encode(tz: dt.tzinfo | None) -> Any:
    if tz is None:
        return None
    if isinstance(tz, zoneinfo.ZoneInfo):
        return ["zone", tz.key]
    if isinstance(tz, dt.timezone):
        offset = tz.utcoffset(None)
        name = tz.tzname(None)
        default = dt.timezone(offset).tzname(None)
        return [
            "offset",
            offset.days,
            offset.seconds,
            offset.microseconds,
            None if name == default else name,
        ]
    raise SerializationError(
        f"cannot store tzinfo {tz!r}: only datetime.timezone and zoneinfo.ZoneInfo are supported"
    )


def _tz_decode(data: Any) -> dt.tzinfo | None:
    if data is None:
        return None
    if data[0] == "zone":
        return zoneinfo.ZoneInfo(data[1])
    _, days, seconds, micros, name = data
    offset = dt.timedelta(days=days, seconds=seconds, microseconds=micros)
    return dt.timezone(offset) if name is None else dt.timezone(offset, name)


def _datetime_encode(v: dt.datetime) -> Any:
    return [
        v.year,
        v.month,
        v.day,
        v.hour,
        v.minute,
        v.second,
        v.microsecond,
        v.fold,
        _tz_encode(v.tzinfo),
    ]


def _datetime_decode(d: Any) -> dt.datetime:
    *parts, fold, tz = d
    return dt.datetime(*parts, fold=fold, tzinfo=_tz_decode(tz))


def _time_encode(v: dt.time) -> Any:
    return [v.hour, v.minute, v.second, v.microsecond, v.fold, _tz_encode(v.tzinfo)]


def _time_decode(d: Any) -> dt.time:
    *parts, fold, tz = d
    return dt.time(*parts, fold=fold, tzinfo=_tz_decode(tz))


# Named after this distribution ("yourpackage.type"): the names are stored in every
# checkpoint holding such a value, so they are part of the file format and never change.
CODECS = (
    Codec("jaxstruct_plugin_datetime.datetime", (dt.datetime,), _datetime_encode, _datetime_decode),
    Codec(
        "jaxstruct_plugin_datetime.date",
        (dt.date,),
        lambda v: [v.year, v.month, v.day],
        lambda d: dt.date(*d),
    ),
    Codec("jaxstruct_plugin_datetime.time", (dt.time,), _time_encode, _time_decode),
    Codec(
        "jaxstruct_plugin_datetime.timedelta",
        (dt.timedelta,),
        lambda v: [v.days, v.seconds, v.microseconds],
        lambda d: dt.timedelta(days=d[0], seconds=d[1], microseconds=d[2]),
    ),
    # str() of a Decimal round-trips exactly, including sign, exponent, NaN and infinities.
    Codec("jaxstruct_plugin_datetime.decimal", (decimal.Decimal,), str, decimal.Decimal),
)


@hookimpl
def jaxstruct_register_codecs() -> list[Codec]:
    """Provide the datetime and Decimal codecs."""
    return list(CODECS)
