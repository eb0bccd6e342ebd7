"""The event log: an append-only log of Parquet segments that df-archiver writes and the pipeline reads.

See docs/pipeline.md. pyarrow is imported on first use, so importing this
package needs only the core's dependencies.
"""

from .journal import Journal, read_journal
from .layout import JOURNAL_DIR, parse_partition, partition_dir, segment_files, utc_date
from .schema import COLUMNS, LOG_SCHEMA_VERSION, Row, arrow_schema, event_row, rows_to_table
from .writer import SegmentWriter

__all__ = [
    "COLUMNS",
    "LOG_SCHEMA_VERSION",
    "JOURNAL_DIR",
    "Row",
    "Journal",
    "SegmentWriter",
    "arrow_schema",
    "event_row",
    "rows_to_table",
    "read_journal",
    "partition_dir",
    "parse_partition",
    "segment_files",
    "utc_date",
]
