"""Open a page in headless Chromium over the DevTools protocol on a pipe (no port, no extra package):
collect console messages, exceptions, failed loads and every network request, evaluate expressions in
the page, and take screenshots.

    python -m tests.report.chromium REPORT.html SHOT.png [--height PX]   # a screenshot for docs/

The browser is Debian's `chromium` (`apt-get install chromium`; .ci/run installs it where missing), or
the executable named by $CAPSIM_CHROMIUM.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PROBLEMS = ("Runtime.exceptionThrown", "Runtime.consoleAPICalled", "Log.entryAdded")


def find_chromium() -> str | None:
    """The browser executable: $CAPSIM_CHROMIUM, else the first of CANDIDATES on PATH."""
    env = os.environ.get("CAPSIM_CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Loaded:
    """What happened while a page loaded."""

    console: list[dict] = field(default_factory=list)      # console calls and log entries, with their level
    exceptions: list[dict] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)      # every URL the page asked for

    def errors(self) -> list[str]:
        """Console errors and warnings, log errors (failed loads) and uncaught exceptions, as text."""
        out = [f"exception: {e.get('exceptionDetails', {}).get('text')}" for e in self.exceptions]
        for c in self.console:
            if c["level"] in ("error", "warning"):
                out.append(f"{c['level']}: {c['text']}")
        return out


class Chromium:
    """One headless browser driven over --remote-debugging-pipe (file descriptors 3 and 4)."""

    def __init__(self, executable: str, width: int = 1200, height: int = 900):
        self.profile = tempfile.TemporaryDirectory(prefix="capsim-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire():  # in the child: the protocol's fds must be exactly 3 (commands) and 4 (replies)
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [executable, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
                "--disable-background-networking", "--disable-component-update", "--mute-audio",
                "--hide-scrollbars", f"--user-data-dir={self.profile.name}", f"--window-size={width},{height}",
                "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=wire, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf, self._id, self.events = b"", 0, []
        self.width, self.height = width, height
        target = self.send("Target.createTarget", {"url": "about:blank"})
        attached = self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=True)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=True)

    # -- protocol ------------------------------------------------------------------------------
    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise EOFError("chromium closed the DevTools pipe (did it start?)")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: bool = False, timeout: float = 60) -> dict:
        """Call a DevTools method (in the page's session when `session`) and return its result."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)

    def wait_for(self, event: str, timeout: float = 60) -> dict:
        """Block until the page's session emits `event` (events already received count)."""
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        for m in self.events[:seen]:
            if m.get("method") == event:
                return m
        while True:
            m = self._read(deadline)
            self.events.append(m)
            if m.get("method") == event:
                return m

    # -- pages -----------------------------------------------------------------------------------
    def open(self, path: str | Path, timeout: float = 60) -> Loaded:
        """Load a local file, wait for its load event and a quiet moment, and say what happened."""
        self.events.clear()
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=True)
        self.wait_for("Page.loadEventFired", timeout)
        self.evaluate("0")   # a round trip: events sent before it are in self.events
        out = Loaded()
        for m in self.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.exceptionThrown":
                out.exceptions.append(p)
            elif m.get("method") == "Runtime.consoleAPICalled":
                out.console.append({"level": p.get("type"), "text": " ".join(str(a.get("value")) for a in p["args"])})
            elif m.get("method") == "Log.entryAdded":
                e = p["entry"]
                out.console.append({"level": e.get("level"), "text": f"{e.get('text')} {e.get('url', '')}".strip()})
            elif m.get("method") == "Network.requestWillBeSent":
                out.requests.append(p["request"]["url"])
        return out

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression evaluated in the page (DevTools, not the page's own script)."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"evaluate {expression[:60]!r}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def screenshot(self, x: float = 0, y: float = 0, width: float | None = None, height: float | None = None) -> bytes:
        """PNG of a region of the page (default: the whole page)."""
        if height is None:
            height = self.send("Page.getLayoutMetrics", session=True)["cssContentSize"]["height"]
        clip = {"x": x, "y": y, "width": width or self.width, "height": height, "scale": 1}
        r = self.send("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                      session=True)
        return base64.b64decode(r["data"])

    def close(self) -> None:
        """Close the browser and wait for it."""
        try:
            self.send("Browser.close", timeout=10)
        except (EOFError, TimeoutError, OSError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self.profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv: list[str] | None = None) -> int:
    """Screenshot a report: python -m tests.report.chromium REPORT.html SHOT.png [--height PX] [--width PX]."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("page")
    p.add_argument("png")
    p.add_argument("--width", type=int, default=1200)
    p.add_argument("--height", type=float, help="CSS pixels from the top (default: the whole page)")
    args = p.parse_args(argv)
    exe = find_chromium()
    if exe is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    with Chromium(exe, args.width) as browser:
        loaded = browser.open(args.page)
        if loaded.errors():
            raise SystemExit("page errors: " + "; ".join(loaded.errors()))
        Path(args.png).write_bytes(browser.screenshot(height=args.height))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
