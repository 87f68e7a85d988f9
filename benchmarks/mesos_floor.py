"""The Mesos readiness floor: the fake master launching the same tasks, each a Python that connects back once.

A scheduler with nothing else to do, on Mesos' v1 scheduler HTTP API (JSON over one
``http.client`` connection for the event stream, another for calls): SUBSCRIBE, accept
the first offers with as many tasks as ``mesos_ready.py`` launches, of the same sizes,
each running ``python -c`` (this interpreter) that connects to a socket this process
listens on, sends its task id and exits. ``floor_s`` runs from the start of the
subscription until the last task's connection is accepted: what the fake master's offer
cycle, a task launch and a Python start cost by themselves. Then TEARDOWN. No coordinator,
no TLS, no node code; status updates are read off the stream and not acknowledged (no
task reports after its first update matters here).
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from typing import Any

TASK_CODE = "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2]))); s.sendall(sys.argv[3].encode()); s.close()"


class _Stream:
    """The SUBSCRIBE response: one RecordIO record (``<len>\\n<json>``) at a time."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.resp = resp

    def next(self) -> dict[str, Any]:
        digits = b""
        while (c := self.resp.read(1)) != b"\n":
            if not c:
                raise ConnectionError("the master ended the event stream")
            digits += c
        return json.loads(self.resp.read(int(digits)))


def _resources(cpus: float, mem: float) -> list[dict[str, Any]]:
    return [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}},
    ]


def run_floor(master: str, tasks: list[tuple[str, float, float]], timeout_s: float = 120.0) -> dict[str, Any]:
    """Launch ``tasks`` ((name, cpus, mem) each) on the master at ``host:port``; see the module's docstring."""
    host, port = master.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.settimeout(timeout_s)
    back_port = listener.getsockname()[1]
    t0 = time.monotonic()
    events = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    calls = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    framework_id = stream_id = None
    try:
        body = {
            "type": "SUBSCRIBE",
            "subscribe": {"framework_info": {"user": "bench", "name": "mesos-floor", "failover_timeout": 0}},
        }
        events.request(
            "POST",
            "/api/v1/scheduler",
            json.dumps(body),
            {"Content-Type": "application/json", "Accept": "application/json"},
        )
        resp = events.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"SUBSCRIBE: {resp.status} {resp.read()[:200]!r}")
        stream_id = resp.getheader("Mesos-Stream-Id")
        stream = _Stream(resp)

        def call(payload: dict[str, Any]) -> None:
            calls.request(
                "POST",
                "/api/v1/scheduler",
                json.dumps({"framework_id": {"value": framework_id}, **payload}),
                {"Content-Type": "application/json", "Mesos-Stream-Id": str(stream_id)},
            )
            r = calls.getresponse()
            text = r.read()
            if r.status != 202:
                raise RuntimeError(f"{payload['type']}: {r.status} {text[:200]!r}")

        launched = False
        while not launched:
            ev = stream.next()
            if ev["type"] == "SUBSCRIBED":
                framework_id = ev["subscribed"]["framework_id"]["value"]
            elif ev["type"] == "OFFERS":
                offer = ev["offers"]["offers"][0]
                infos = [
                    {
                        "name": name,
                        "task_id": {"value": f"floor-{i}"},
                        "agent_id": offer["agent_id"],
                        "resources": _resources(cpus, mem),
                        "command": {
                            "shell": False,
                            "value": sys.executable,
                            "arguments": [
                                sys.executable,
                                "-c",
                                TASK_CODE,
                                "127.0.0.1",
                                str(back_port),
                                f"floor-{i}",
                            ],
                        },
                    }
                    for i, (name, cpus, mem) in enumerate(tasks)
                ]
                call(
                    {
                        "type": "ACCEPT",
                        "accept": {
                            "offer_ids": [offer["id"]],
                            "operations": [{"type": "LAUNCH", "launch": {"task_infos": infos}}],
                        },
                    }
                )
                launched = True
        seen = set()
        while len(seen) < len(tasks):
            conn, _ = listener.accept()
            with conn:
                seen.add(conn.recv(64))
        floor_s = time.monotonic() - t0
        call({"type": "TEARDOWN"})
        return {"floor_s": round(floor_s, 3), "tasks": len(seen)}
    finally:
        listener.close()
        events.close()
        calls.close()
