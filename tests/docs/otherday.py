"""Run MkDocs as if today were another day: ``python otherday.py YYYY-MM-DD build ...``.

There is no faketime on these machines. MkDocs reads the clock in one place,
``mkdocs.utils.get_build_datetime`` (``datetime.now`` unless SOURCE_DATE_EPOCH is set),
for the pages' dates and the sitemap's gzip header; this replaces that module's
``datetime`` with one whose ``now()`` is noon UTC of the given day, then runs MkDocs'
command line with the remaining arguments. The tests pass it as the Makefile's MKDOCS.
"""

from __future__ import annotations

import datetime as dt
import sys

import mkdocs.utils
from mkdocs.__main__ import cli

DAY = dt.date.fromisoformat(sys.argv.pop(1))


class _OtherDay(dt.datetime):
    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:
        noon = dt.datetime(DAY.year, DAY.month, DAY.day, 12, tzinfo=dt.UTC)
        return noon.astimezone(tz) if tz is not None else noon.replace(tzinfo=None)


mkdocs.utils.datetime = _OtherDay  # type: ignore[misc]
cli()
