"""The datetime and Decimal codecs pass jaxstruct's conformance tests for codec plugins."""

import datetime as dt
import decimal
import zoneinfo

from hypothesis import strategies as st
from jaxstruct.testing import CodecTests
from jaxstruct_plugin_datetime import CODECS

DATETIME, DATE, TIME, TIMEDELTA, DECIMAL = CODECS

UTC = dt.UTC
ZONES = (
    st.none()
    | st.just(UTC)
    | st.builds(
        dt.timezone,
        st.timedeltas(min_value=-dt.timedelta(hours=23), max_value=dt.timedelta(hours=23)),
    )
)


class TestDatetime(CodecTests):
    """datetime values, naive and aware (fixed offsets, named offsets, IANA zones, fold)."""

    codec = DATETIME
    examples = [
        dt.datetime(2026, 12, 7, tzinfo=UTC),
        dt.datetime(2026, 12, 7, 1, 2, 3, 456789),
        dt.datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("America/New_York")),
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5), "EST")),
        dt.datetime.max,
    ]
    strategy = st.datetimes(timezones=ZONES)


class TestDate(CodecTests):
    codec = DATE
    examples = [dt.date(2026, 12, 7), dt.date.min, dt.date.max]
    strategy = st.dates()


class TestTime(CodecTests):
    codec = TIME
    examples = [dt.time(), dt.time(23, 59, 59, 999999, tzinfo=UTC), dt.time(1, 30, fold=1)]
    strategy = st.times(timezones=ZONES)


class TestTimedelta(CodecTests):
    codec = TIMEDELTA
    examples = [dt.timedelta(0), dt.timedelta(days=-1, microseconds=1), dt.timedelta.max]
    strategy = st.timedeltas()


class TestDecimal(CodecTests):
    """Decimals keep sign, exponent and special values (NaN, sNaN, infinities)."""

    codec = DECIMAL
    examples = [
        decimal.Decimal("1.50"),
        decimal.Decimal("-0"),
        decimal.Decimal("NaN"),
        decimal.Decimal("-sNaN12"),
        decimal.Decimal("Infinity"),
        decimal.Decimal("1E+999999"),
    ]
    strategy = st.decimals()
