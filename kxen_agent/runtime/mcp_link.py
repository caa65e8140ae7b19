"""The connections of one run to its MCP servers, through the official ``mcp`` SDK (§14.15).

This module owns the processes and the protocol: one event-loop thread per
:class:`McpLinks` driving the SDK's ``ClientSession`` of every server; a
stdio server started in its own session (so its own process group), with
the run's tool environment (``[policy] env_keep`` and the server's own
``env_keep`` names), its pgid recorded in a small file under the state
dir's ``mcp/`` (:func:`.mcp_procs.reap_orphans` kills the group a SIGKILLed run left
behind) and its group ended when the links close; a ``url`` server over
streamable HTTP. A call is made from the run's thread (:meth:`McpLinks.call`)
and waits for the answer, the run's cancel event (Ctrl-C: the call's task is
cancelled, which makes the SDK send ``notifications/cancelled`` with the
request's id) or its timeout (the SDK's read timeout, which sends the same
notification).

It never journals nor decides what a failure means for recovery: it raises
:class:`McpFailure` with a one-line message and ``kind`` (``start``,
``crash``, ``protocol``, ``timeout``, ``cancel``), and the tool adapter
(:mod:`.mcp_tools`) decides.

The SDK (pydantic, anyio, httpx) takes most of a second to import: it is
imported here, and this module only by a run whose lock has MCP servers.

Limitations: a server that leaves its process group on purpose (a double
fork into a new session) escapes the kill, as a shell command's would; a
server started and then SIGKILLed with its run before its pgid file is
written (a window of one ``fsync``) is not reaped by the next run, though a
stdio server normally exits when its standard input closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import tempfile
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import mcp_types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

from .mcp_procs import kill_group as _kill_group, proc_start as _proc_start

__all__ = ["McpFailure", "McpLinks", "ServerLink"]

#: The longest a server may take to start and answer ``initialize`` and ``tools/list``.
START_TIMEOUT_S = 30.0
#: After its standard input closes, how long a server has to exit before its group gets SIGTERM, then SIGKILL.
_EXIT_GRACE_S = 1.0
_STDERR_TAIL = 400
#: The longest JSON-RPC line read from a stdio server: past it the server is ended (a protocol error).
_MAX_LINE = 64 << 20


class McpFailure(Exception):
    """An MCP call or start-up failed; ``kind`` says how (see the module doc), the message is one line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ServerLink:
    """One server: its launch spec, and while connected its SDK session (used from the loop thread only)."""

    def __init__(self, name: str, spec: dict[str, Any], env: dict[str, str], cwd: str, pid_dir: str | None) -> None:
        self.name = name
        self.spec = spec
        self.env = env
        self.cwd = cwd
        self.pid_dir = pid_dir
        self.session: ClientSession | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self._closing: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stderr = tempfile.TemporaryFile()
        self._pid_file: str | None = None

    def where(self) -> str:
        return f"MCP server {self.name!r} ({self.spec.get('command') or self.spec.get('url')})"

    def stderr_tail(self) -> str:
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - _STDERR_TAIL))
            tail = _one_line(self._stderr.read().decode("utf-8", "replace"))
        except (OSError, ValueError):
            return ""
        return f"; its stderr ends: {tail}" if tail else ""

    def gone(self, when: str = "") -> str:
        """Why the server is no longer there (``when``: e.g. " during the call"), for a message."""
        code = self.returncode
        what = (f"exited with status {code}" if code is not None and code >= 0
                else f"was killed by signal {-code}" if code is not None else "closed the connection")
        return f"{self.where()} {what}{when}{self.stderr_tail()}"

    # ------------------------------------------------------------ the pgid record

    def _record(self, pid: int) -> None:
        if self.pid_dir is None:
            return
        os.makedirs(self.pid_dir, exist_ok=True)
        path = os.path.join(self.pid_dir, f"{os.getpid()}-{pid}.json")
        data = json.dumps({"owner": os.getpid(), "ownerStart": _proc_start(os.getpid()), "pgid": pid,
                           "start": _proc_start(pid), "server": self.name}).encode()
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(self.pid_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._pid_file = path

    def _unrecord(self) -> None:
        if self._pid_file is not None:
            try:
                os.unlink(self._pid_file)
            except FileNotFoundError:
                pass
            self._pid_file = None

    # ------------------------------------------------------------ transports (loop thread)

    @asynccontextmanager
    async def _stdio(self) -> AsyncIterator[tuple[Any, Any]]:
        try:
            proc = await anyio.open_process([self.spec["command"], *self.spec.get("args", [])], env=self.env,
                                            cwd=self.cwd, stderr=self._stderr, start_new_session=True)
        except OSError as e:
            raise McpFailure("start", f"{self.where()} could not be started: {e.strerror or e}; check command "
                                      "(and PATH) in the agent definition") from None
        self.pid = proc.pid
        try:
            self._record(proc.pid)
        except OSError:
            _kill_group(proc.pid, signal.SIGKILL)
            raise
        in_send, in_recv = anyio.create_memory_object_stream[Any](16)
        out_send, out_recv = anyio.create_memory_object_stream[Any](16)

        async def reader() -> None:
            assert proc.stdout is not None
            buf = b""
            not_rpc = False
            async with in_send:
                try:
                    async for chunk in proc.stdout:
                        buf += chunk
                        if len(buf) > _MAX_LINE:
                            self.protocol_error = McpFailure(
                                "protocol", f"{self.where()} wrote a line longer than {_MAX_LINE >> 20} MiB")
                            _kill_group(proc.pid, signal.SIGKILL)
                            break
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            if not line.strip():
                                continue
                            try:
                                msg: Any = SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line))
                            except ValueError as e:
                                not_rpc = True
                                msg = McpFailure("protocol", f"{self.where()} wrote a line that is not a JSON-RPC "
                                                             f"message: {_one_line(str(e))[:200]}")
                                self.protocol_error = msg
                                # The stream cannot be trusted from here on: end the server, which ends
                                # the call with "connection closed", reported as this protocol error. Nothing
                                # after the bad line is read, not even an answer already in the pipe.
                                _kill_group(proc.pid, signal.SIGKILL)
                                break
                            await in_send.send(msg)
                        if not_rpc:
                            break
                except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    pass
            self.returncode = proc.returncode if proc.returncode is not None else await _reap(proc)
            if self._closing is not None:
                self._closing.set()  # the server is gone: its session ends, the next call starts it again

        async def writer() -> None:
            assert proc.stdin is not None
            try:
                async with out_recv:
                    async for m in out_recv:
                        data = m.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                        await proc.stdin.send(data.encode())
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            try:
                yield in_recv, out_send
            finally:
                with anyio.CancelScope(shield=True):
                    await out_send.aclose()
                    try:
                        await proc.stdin.aclose()  # the spec's shutdown: stdin closed, then signals
                    except (OSError, anyio.BrokenResourceError):
                        pass
                    with anyio.move_on_after(_EXIT_GRACE_S):
                        await proc.wait()
                    if proc.returncode is None:
                        _kill_group(proc.pid, signal.SIGTERM)
                        with anyio.move_on_after(_EXIT_GRACE_S):
                            await proc.wait()
                    _kill_group(proc.pid, signal.SIGKILL)  # the rest of the group, if any is left
                    if proc.returncode is None:
                        await proc.wait()
                    self._unrecord()
                tg.cancel_scope.cancel()

    @asynccontextmanager
    async def _http(self) -> AsyncIterator[tuple[Any, Any]]:
        from mcp.client.streamable_http import streamable_http_client

        async with streamable_http_client(self.spec["url"]) as streams:
            yield streams[0], streams[1]

    async def serve(self, started: asyncio.Future) -> None:
        """Connect, initialize and list the tools (``started`` gets the listing), then wait to be closed."""
        self._closing = asyncio.Event()
        self.protocol_error: McpFailure | None = None
        try:
            transport = self._stdio() if "command" in self.spec else self._http()
            async with transport as (read, write):
                async with ClientSession(read, write, message_handler=self._on_message) as session:
                    with anyio.fail_after(START_TIMEOUT_S):
                        await session.initialize()
                        tools: list[Any] = []
                        cursor = None
                        while True:
                            page = await session.list_tools(
                                params=mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                            tools.extend(page.tools)
                            cursor = page.next_cursor
                            if not cursor:
                                break
                    self.session = session
                    started.set_result(tools)
                    await self._closing.wait()
        except BaseException as e:  # noqa: BLE001 - reported to the caller waiting on ``started``
            if not started.done():
                started.set_exception(self._start_failure(e))
        finally:
            self.session = None

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.protocol_error = message if isinstance(message, McpFailure) else McpFailure(
                "protocol", f"{self.where()}: {_one_line(str(message))[:200]}")

    def _start_failure(self, e: BaseException) -> McpFailure:
        if isinstance(e, BaseExceptionGroup):
            inner = [x for x in e.exceptions if not isinstance(x, asyncio.CancelledError)]
            if inner:
                return self._start_failure(inner[0])
        if isinstance(e, McpFailure):
            return e
        if isinstance(e, TimeoutError):
            return McpFailure("start", f"{self.where()} did not answer initialize and tools/list within "
                                       f"{START_TIMEOUT_S:.0f} s{self.stderr_tail()}")
        if self.returncode is not None or isinstance(e, MCPError):
            return McpFailure("start", self.gone(" before answering initialize (check its command and args in "
                                                 "the agent definition)"))
        return McpFailure("start", f"{self.where()} failed to start: {type(e).__name__}: {_one_line(str(e))[:200]}"
                                   f"{self.stderr_tail()}")


async def _reap(proc: Any) -> int | None:
    with anyio.move_on_after(_EXIT_GRACE_S):
        return await proc.wait()
    return proc.returncode


class McpLinks:
    """The MCP servers of one run: started on demand, called from the run's thread, all closed at the end."""

    def __init__(self, pid_dir: str | None) -> None:
        self.pid_dir = pid_dir
        self.servers: dict[str, ServerLink] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kxen-mcp", daemon=True)
        self._thread.start()

    def _submit(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def start(self, link: ServerLink) -> list[Any]:
        """Start ``link``, return its tool listing (the SDK's ``Tool`` models); raises :class:`McpFailure`."""
        async def go() -> list[Any]:
            started = self._loop.create_future()
            link._task = asyncio.ensure_future(link.serve(started))
            return await started

        tools = self._submit(go()).result()
        self.servers[link.name] = link
        return tools

    def stop(self, link: ServerLink) -> None:
        """End one server (as :meth:`close` does), e.g. one whose listing is not the lock's."""
        async def go() -> None:
            if link._closing is not None:
                link._closing.set()
            if link._task is not None:
                await asyncio.gather(link._task, return_exceptions=True)

        try:
            self._submit(go()).result(timeout=3 * _EXIT_GRACE_S + 5)
        except BaseException:  # noqa: BLE001 - a wedged server: its group is killed below anyway
            pass
        if link.pid is not None:
            _kill_group(link.pid, signal.SIGKILL)
        link._unrecord()
        if self.servers.get(link.name) is link:
            del self.servers[link.name]

    def call(self, link: ServerLink, tool: str, arguments: dict[str, Any], *, timeout_s: float,
             cancel: threading.Event) -> Any:
        """The server's ``CallToolResult``; raises :class:`McpFailure` (crash, protocol, timeout, canceled)."""
        session = link.session
        if session is None:
            raise McpFailure("crash", f"{link.gone()}; it is started again by the next call")

        ended = threading.Event()
        running: dict[str, asyncio.Task] = {}

        async def go() -> Any:
            running["task"] = asyncio.current_task()  # type: ignore[assignment]
            try:
                return await session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
            finally:
                ended.set()

        fut = self._submit(go())
        # The SDK's read timeout ends the call; this is only a backstop should it not.
        deadline = time.monotonic() + timeout_s + 10
        while True:
            try:
                return fut.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                late = time.monotonic() > deadline
                if cancel.is_set() or late:
                    # Cancelling the call's task makes the SDK send notifications/cancelled with the
                    # request's id (shielded, bounded); wait for that before going on.
                    task = running.get("task")
                    self._loop.call_soon_threadsafe(task.cancel) if task is not None else fut.cancel()
                    ended.wait(timeout=5)
                    if late:
                        raise McpFailure("timeout", f"{link.where()} did not answer within {timeout_s:g} s "
                                                    "(tool_timeout_s); it was sent notifications/cancelled") from None
                    raise McpFailure("cancel", f"canceled by the user; {link.where()} was sent "
                                               "notifications/cancelled for the call") from None
            except MCPError as e:
                raise self._call_failure(link, e, timeout_s) from None
            except concurrent.futures.CancelledError:
                raise McpFailure("crash", link.gone()) from None
            except Exception as e:  # noqa: BLE001 - an answer the SDK could not read as a tools/call result
                raise McpFailure("protocol", f"{link.where()} answered with something that is not a tools/call "
                                             f"result: {type(e).__name__}: {_one_line(str(e))[:300]}") from None

    def _call_failure(self, link: ServerLink, e: MCPError, timeout_s: float) -> McpFailure:
        if e.code == REQUEST_TIMEOUT:
            return McpFailure("timeout", f"{link.where()} did not answer within {timeout_s:g} s "
                                         "(tool_timeout_s); it was sent notifications/cancelled for the call")
        if e.code == CONNECTION_CLOSED:
            # Give the reader a moment to see the process exit, for the message's status.
            deadline = time.monotonic() + 1.0
            while link.returncode is None and link.pid is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            if link.protocol_error is not None:
                return link.protocol_error
            return McpFailure("crash", link.gone(" during the call"))
        return McpFailure("protocol", f"{link.where()} answered with JSON-RPC error {e.code}: "
                                      f"{_one_line(e.message)[:300]}")

    def close(self) -> None:
        """End every server (stdin closed, then SIGTERM, then SIGKILL to its group) and the loop thread."""
        async def stop() -> None:
            for link in self.servers.values():
                if link._closing is not None:
                    link._closing.set()
            tasks = [link._task for link in self.servers.values() if link._task is not None]
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._submit(stop()).result(timeout=3 * _EXIT_GRACE_S + 5)
        except BaseException:  # noqa: BLE001 - a wedged server: its group is killed below anyway
            pass
        for link in self.servers.values():
            if link.pid is not None:
                _kill_group(link.pid, signal.SIGKILL)
            link._unrecord()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
