"""Files through Hadoop's FileSystem API, so the jobs read and write any path Spark can.

A local path, ``file:``, ``hdfs:`` or ``s3a:`` alike: listing the log,
reading and writing manifests and reports, renaming and deleting snapshot
generations all go through the JVM of the Spark session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["HadoopFs"]


class HadoopFs:
    """The Hadoop FileSystem of ``root`` in ``spark``'s JVM."""

    def __init__(self, spark: SparkSession, root: str):
        jvm: Any = spark._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        try:
            self._fs = self._Path(root).getFileSystem(spark._jsc.hadoopConfiguration())
        except Exception as exc:  # py4j wraps every Java exception in its own type
            raise PipelineError(f"cannot open the file system of {root}: {exc}") from exc

    def listdir(self, path: str) -> list[str]:
        """Names in directory ``path``; empty if it does not exist."""
        p = self._Path(path)
        if not self._fs.exists(p):
            return []
        return [s.getPath().getName() for s in self._fs.listStatus(p)]

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return bool(self._fs.exists(self._Path(path)))

    def read_bytes(self, path: str) -> bytes:
        """The content of file ``path``."""
        p = self._Path(path)
        length = int(self._fs.getFileStatus(p).getLen())
        stream = self._fs.open(p)
        try:
            data = bytearray()
            while len(data) < length:
                chunk = stream.readNBytes(min(1 << 20, length - len(data)))
                if not chunk:
                    break
                data += chunk
            return bytes(data)
        finally:
            stream.close()

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``path`` whole: to a hidden temporary name first, then renamed into place."""
        final = self._Path(path)
        tmp = self._Path(final.getParent(), "." + final.getName() + ".tmp")
        stream = self._fs.create(tmp, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
        if self._fs.exists(final):
            self._fs.delete(final, False)
        if not self._fs.rename(tmp, final):
            raise PipelineError(f"cannot rename {tmp} to {final}")

    def delete(self, path: str) -> None:
        """Remove ``path`` (recursively)."""
        self._fs.delete(self._Path(path), True)

    def qualify(self, path: str) -> str:
        """``path`` as a full URI (``file:/...``, ``hdfs://...``)."""
        return str(self._fs.makeQualified(self._Path(path)).toString())
