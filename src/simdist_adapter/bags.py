"""Episode bags: rosbag2 MCAP directories written and read with `rosbags` (pure Python, no ROS).

One episode = one bag directory `<root>/<name>/` holding `<name>.mcap`, rosbag2's `metadata.yaml`
(episode metadata also in its `custom_data`) and the sidecar `episode.json` (task, seed, success,
...). Messages are stored as the CDR bytes ROS put on the wire (the recorder subscribes raw), so
nothing is re-serialised; types are checked against rosbags' ROS 2 Kilted typestore and every
channel carries its full message definition, so any MCAP reader (`mcap` + `mcap_ros2`) decodes it.

`EpisodeBag` is the reader the adapter and replay use: metadata, topics, and messages by topic,
deserialised or raw. A bag that was never finalised, is truncated or corrupt raises `BagError`
saying which file and what is wrong.

A writer killed before `close()` leaves an MCAP without its summary and no `metadata.yaml`.
`EpisodeBagWriter.flush()` bounds what such a crash loses (the recorder calls it every
`flush_period_s`), and `recover_bag()` (`simdist-bag recover DIR`, as `ros2 bag reindex`) rebuilds
a readable, finalised bag from every complete record of the unfinalised file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import struct
from dataclasses import dataclass, field
from typing import Any, Iterator

import yaml
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.rosbag2.storage_mcap import McapWriter
from rosbags.typesys import Stores, get_typestore

TYPESTORE = get_typestore(Stores.ROS2_KILTED)
SIDECAR = "episode.json"
META_KEY = "simdist_episode"  # key of the episode JSON in metadata.yaml custom_data
BAG_FORMAT_VERSION = 1
_MCAP_MAGIC = b"\x89MCAP0\r\n"  # the first 8 bytes of every MCAP file


class BagError(RuntimeError):
    """An episode bag that cannot be written or read; the message names the file and the cause."""


@dataclass
class EpisodeMeta:
    """What an episode was: stored in the sidecar JSON and in the bag's metadata."""

    task: str
    seed: int | None = None
    episode: int = 0
    success: bool | None = None  # None until the episode ends (or when it was interrupted)
    robot: str = ""
    variant: str = ""
    checkpoint: str = ""
    steps: int = 0
    complete: bool = False  # True once the episode ended and the bag was finalised
    start_ns: int = 0
    end_ns: int = 0
    extra: dict = field(default_factory=dict)
    format_version: int = BAG_FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str = "episode metadata") -> "EpisodeMeta":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BagError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise BagError(f"{where}: expected a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown or "task" not in data:
            raise BagError(
                f"{where}: unknown keys {unknown} or missing 'task' (keys: {sorted(data)})"
            )
        if data.get("format_version") != BAG_FORMAT_VERSION:
            raise BagError(
                f"{where}: format_version {data.get('format_version')!r}, "
                f"this code reads {BAG_FORMAT_VERSION}"
            )
        return cls(**data)


@dataclass(frozen=True)
class BagMessage:
    topic: str
    msgtype: str  # e.g. "sensor_msgs/msg/JointState"
    stamp_ns: int  # receive time of the recorder (node clock: sim time in lockstep)
    data: Any  # deserialised message (rosbags dataclass) or raw CDR bytes


def ros_type_name(msgtype: str) -> str:
    """'sensor_msgs/msg/Image' from 'sensor_msgs/msg/Image' or 'sensor_msgs/Image'."""
    parts = msgtype.split("/")
    if len(parts) == 2:
        parts = [parts[0], "msg", parts[1]]
    name = "/".join(parts)
    if len(parts) != 3 or name not in TYPESTORE.types:
        raise BagError(f"message type {msgtype!r} is not a ROS 2 Kilted type rosbags knows")
    return name


class EpisodeBagWriter:
    """Writes one episode bag; `close()` finalises it (the context manager also on exceptions)."""

    def __init__(self, path: str | os.PathLike, meta: EpisodeMeta):
        self.path = pathlib.Path(path)
        if self.path.exists():
            raise BagError(
                f"bag directory {self.path} already exists; refusing to overwrite an episode"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.meta = meta
        writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        writer.open()
        self._writer: Writer | None = writer  # None once closed
        self._connections: dict[str, Any] = {}
        self.message_count = 0
        self._write_sidecar()

    def _live(self) -> Writer:
        if self._writer is None:
            raise BagError(f"{self.path}: the bag is closed")
        return self._writer

    def add_topic(self, topic: str, msgtype: str) -> None:
        """Declare a topic; idempotent for the same type, an error for a different one."""
        name = ros_type_name(msgtype)
        known = self._connections.get(topic)
        if known is not None:
            if known.msgtype != name:
                raise BagError(f"topic {topic} already recorded as {known.msgtype}, got {name}")
            return
        self._connections[topic] = self._live().add_connection(topic, name, typestore=TYPESTORE)

    def has_topic(self, topic: str) -> bool:
        return topic in self._connections

    def write_raw(self, topic: str, stamp_ns: int, cdr: bytes | memoryview) -> None:
        """Store a message exactly as serialised on the wire (CDR with its 4-byte header)."""
        connection = self._connections.get(topic)
        if connection is None:
            raise BagError(f"topic {topic} was not declared with add_topic")
        self._live().write(connection, int(stamp_ns), bytes(cdr))
        self.message_count += 1
        if self.meta.start_ns == 0:
            self.meta.start_ns = int(stamp_ns)
        self.meta.end_ns = max(self.meta.end_ns, int(stamp_ns))

    def write(self, topic: str, stamp_ns: int, msg: Any) -> None:
        """Serialise a rosbags message object with the Kilted typestore and store it."""
        connection = self._connections.get(topic)
        if connection is None:
            raise BagError(f"topic {topic} was not declared with add_topic")
        self.write_raw(topic, stamp_ns, TYPESTORE.serialize_cdr(msg, connection.msgtype))

    def flush(self) -> None:
        """Put every message written so far into the file: the pending MCAP chunk is closed and
        the file buffer handed to the OS, so a crash after this loses none of them.

        rosbags' MCAP writer (the pinned version) keeps up to 1 MiB of messages in an in-memory
        chunk and has no public flush; this closes that chunk early through its storage object.
        """
        storage = None if self._writer is None else self._writer.storage
        if not isinstance(storage, McapWriter):  # None: closed (the bags are always MCAP)
            return
        if storage.chunk.bio.tell():
            storage.close_chunk()
        storage.bio.flush()

    def close(self) -> None:
        """Finalise the MCAP (summary, index) and metadata.yaml, then the sidecar. Idempotent."""
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        writer.set_custom_data(META_KEY, self.meta.to_json())
        writer.close()
        self._write_sidecar()

    def _write_sidecar(self) -> None:
        tmp = self.path / (SIDECAR + ".tmp")
        tmp.write_text(self.meta.to_json())
        os.replace(tmp, self.path / SIDECAR)  # atomic: a reader never sees half a file

    def __enter__(self) -> "EpisodeBagWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EpisodeBag:
    """Read an episode bag: `meta`, `topics` (topic -> type), `messages(topics)`."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        if not self.path.is_dir():
            raise BagError(f"{self.path}: not a bag directory")
        if not (self.path / "metadata.yaml").is_file():
            raise BagError(
                f"{self.path}: no metadata.yaml, the bag was never finalised "
                "(recorder killed with SIGKILL or crashed before closing it)"
            )
        reader = self._open()
        self._reader: Reader | None = reader  # None once closed
        try:
            self.topics = {c.topic: c.msgtype for c in reader.connections}
            self.message_count = reader.message_count
            self.meta = self._read_meta()
        except BagError:
            self.close()
            raise

    def _open(self) -> Reader:
        reader = Reader(self.path)
        try:
            reader.open()
        except Exception as exc:  # noqa: BLE001 - rosbags raises several types for a bad file
            raise BagError(
                f"{self.path}: cannot open the bag, it is truncated or corrupt ({exc})"
            ) from None
        return reader

    def _read_meta(self) -> EpisodeMeta:
        sidecar = self.path / SIDECAR
        if sidecar.is_file():
            return EpisodeMeta.from_json(sidecar.read_text(), str(sidecar))

        info = yaml.safe_load((self.path / "metadata.yaml").read_text()) or {}
        custom = info.get("rosbag2_bagfile_information", {}).get("custom_data") or {}
        if META_KEY in custom:
            return EpisodeMeta.from_json(custom[META_KEY], f"{self.path}/metadata.yaml custom_data")
        raise BagError(f"{self.path}: no {SIDECAR} and no episode metadata in metadata.yaml")

    def raw_messages(self, topics: list[str] | None = None) -> Iterator[BagMessage]:
        """Messages in time order as raw CDR bytes (what replay publishes)."""
        wanted = self._connections(topics)
        if not wanted:  # rosbags reads every connection when given none
            return
        try:
            for conn, stamp, data in self._live().messages(connections=wanted):
                yield BagMessage(conn.topic, conn.msgtype, stamp, bytes(data))
        except BagError:
            raise
        except Exception as exc:  # noqa: BLE001 - truncated chunks surface as various errors
            raise BagError(
                f"{self.path}: reading messages failed, the bag is truncated or corrupt ({exc})"
            ) from None

    def messages(self, topics: list[str] | None = None) -> Iterator[BagMessage]:
        """Messages in time order, deserialised to rosbags message objects."""
        for raw in self.raw_messages(topics):
            try:
                msg = TYPESTORE.deserialize_cdr(raw.data, raw.msgtype)
            except Exception as exc:  # noqa: BLE001
                raise BagError(
                    f"{self.path}: a {raw.msgtype} message on {raw.topic} does not decode ({exc})"
                ) from None
            yield BagMessage(raw.topic, raw.msgtype, raw.stamp_ns, msg)

    def _live(self) -> Reader:
        if self._reader is None:
            raise BagError(f"{self.path}: the bag is closed")
        return self._reader

    def _connections(self, topics):
        if topics is None:
            return list(self._live().connections)
        missing = sorted(set(topics) - set(self.topics))
        if missing:
            raise BagError(f"{self.path}: no topic(s) {missing}; the bag has {sorted(self.topics)}")
        return [c for c in self._live().connections if c.topic in topics]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> "EpisodeBag":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def list_episode_bags(root: str | os.PathLike) -> list[pathlib.Path]:
    """Bag directories under `root` (those with an episode sidecar), oldest first by name."""
    root = pathlib.Path(root)
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.glob(f"*/{SIDECAR}"))


def unfinalised_bags(root: str | os.PathLike) -> list[pathlib.Path]:
    """Bag directories under `root` that hold an MCAP but no metadata.yaml (writer killed)."""
    root = pathlib.Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p.parent for p in root.glob("*/*.mcap") if not (p.parent / "metadata.yaml").is_file()
    )


@dataclass(frozen=True)
class Recovery:
    """What `recover_bag` rebuilt."""

    path: pathlib.Path
    messages: int  # messages in the recovered bag
    topics: int
    truncated: bool  # the file ended inside a record: what followed the last complete one is lost
    original: pathlib.Path  # the unfinalised MCAP, kept beside the recovered one


def recover_bag(path: str | os.PathLike) -> Recovery:
    """Rebuild an unfinalised episode bag in place: every complete message of its MCAP goes into a
    new, finalised MCAP with metadata.yaml (the episode sidecar's metadata, `complete` false and
    `recovered` true). The original file stays in the directory as `<name>.mcap.unfinalised`.
    A file cut before its first record (a writer killed as it created the bag) gives an empty
    bag. Raises BagError if `path` is not an unfinalised bag, or its file is not an MCAP or
    holds messages but no channel record.
    """
    from mcap.exceptions import McapError  # noqa: PLC0415 - only recovery reads raw MCAP records
    from mcap.records import Channel, Message, Schema  # noqa: PLC0415
    from mcap.stream_reader import StreamReader  # noqa: PLC0415

    path = pathlib.Path(path)
    if (path / "metadata.yaml").is_file():
        raise BagError(f"{path}: already finalised (metadata.yaml present); nothing to recover")
    sources = sorted(path.glob("*.mcap"))
    if len(sources) != 1:
        raise BagError(f"{path}: expected one .mcap file to recover, found {len(sources)}")
    source = sources[0]
    schemas, channels, messages, truncated = {}, {}, [], False
    with source.open("rb") as f:
        try:
            for record in StreamReader(f, skip_magic=False).records:
                if isinstance(record, Schema):
                    schemas[record.id] = record
                elif isinstance(record, Channel):
                    channels[record.id] = record
                elif isinstance(record, Message):
                    messages.append(record)
        except (McapError, EOFError, ValueError, OSError, struct.error):  # the record cut short
            truncated = True
    with source.open("rb") as f:
        head = f.read(len(_MCAP_MAGIC))
    if not channels and (messages or not _MCAP_MAGIC.startswith(head)):
        raise BagError(f"{source}: no complete channel record; nothing can be recovered")
    # No channel record and the file is (a start of) the MCAP magic and header: the writer was
    # killed within moments of creating it, before its first flush. The episode recorded
    # nothing that reached the disk; the recovered bag is empty.
    sidecar = path / SIDECAR
    meta = (
        EpisodeMeta.from_json(sidecar.read_text(), str(sidecar))
        if sidecar.is_file()
        else EpisodeMeta(task=path.name)
    )
    meta.complete = False
    meta.extra["recovered"] = True
    staging = path.parent / f".{path.name}.recovering"
    shutil.rmtree(staging, ignore_errors=True)
    rebuilt = staging / path.name
    meta.start_ns = meta.end_ns = 0
    with EpisodeBagWriter(rebuilt, meta) as bag:
        for m in sorted(messages, key=lambda m: m.log_time):
            channel = channels.get(m.channel_id)
            schema = None if channel is None else schemas.get(channel.schema_id)
            if channel is None or schema is None:
                continue  # its channel record was lost with the crash
            if not bag.has_topic(channel.topic):
                bag.add_topic(channel.topic, schema.name)
            bag.write_raw(channel.topic, m.log_time, m.data)
        count, topics = bag.message_count, len(bag._connections)
    original = rebuilt / f"{source.name}.unfinalised"
    os.replace(source, original)
    shutil.rmtree(path)
    os.replace(rebuilt, path)
    staging.rmdir()
    return Recovery(path, count, topics, truncated, path / original.name)
