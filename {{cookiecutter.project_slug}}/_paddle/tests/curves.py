"""Curves read back with VisualDL's own reader, for test_tracking.py and test_visualdl_records.py."""

from pathlib import Path

from visualdl import LogReader

WRITER_MODULE = "visualdl"  # what tracking.Tracker imports to write
CPU = "cpu"
RECORDS = "vdlrecords.run.log"  # the one file VisualDL reads in visualdl/


def curve(output_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of each record of `tag`, values rounded to 6 digits."""
    reader = LogReader(file_path=str(Path(output_dir) / "visualdl" / RECORDS))
    return [(item.id, round(item.value, 6)) for item in reader.get_data("scalar", tag)]
