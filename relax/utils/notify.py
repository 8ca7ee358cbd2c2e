"""Run alerts through Apprise (`--notify-urls`): run start, failure (with the error) and finish.

Apprise turns one URL per service into a message there (Slack, Discord, Telegram, e-mail, a
plain JSON POST with `json://host:port/path`, ...). `Notifier` checks every URL when the run is
configured (an unknown scheme or a malformed URL is a configuration error naming it) and sends
each message from a daemon thread with a deadline, so a slow or dead endpoint never holds up
training; a message that could not be delivered is logged, never raised.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 10.0


def split_urls(urls: str | None) -> list[str]:
    """`--notify-urls`: comma-separated Apprise URLs (blanks ignored)."""
    return [u.strip() for u in (urls or "").split(",") if u.strip()]


def check_urls(urls: str | None) -> list[str]:
    """The URLs, each accepted by Apprise; ValueError naming the first one it does not know."""
    import apprise

    found = split_urls(urls)
    for url in found:
        if not apprise.Apprise().add(url):
            raise ValueError(f"--notify-urls: Apprise does not accept {url!r}; see "
                             "https://github.com/caronc/apprise/wiki for the URL of each service "
                             "(e.g. json://host:port/path, slack://..., mailto://...)")
    return found


class Notifier:
    """Sends the run's alerts to every `--notify-urls` URL (nothing when there are none)."""

    def __init__(self, urls: str | None, run_name: str, timeout_s: float = SEND_TIMEOUT_S):
        self.urls = check_urls(urls)
        self.run_name, self.timeout_s = run_name, timeout_s
        self._threads: list[threading.Thread] = []

    def send(self, title: str, body: str, kind: str = "info") -> None:
        """Deliver in the background; `kind`: info, success, warning or failure (Apprise's types)."""
        if not self.urls:
            return
        thread = threading.Thread(target=self._deliver, args=(f"[relax] {self.run_name}: {title}", body, kind),
                                  daemon=True, name="relax-notify")
        thread.start()
        self._threads.append(thread)

    def _deliver(self, title: str, body: str, kind: str) -> None:
        import apprise

        try:
            notifier = apprise.Apprise()
            for url in self.urls:
                notifier.add(url)
            if not notifier.notify(title=title, body=body, notify_type=getattr(apprise.NotifyType, kind.upper())):
                logger.warning("--notify-urls: %r was not delivered to every URL", title)
        except Exception as exc:  # noqa: BLE001 - an alert must never stop the run
            logger.warning("--notify-urls: sending %r failed: %s", title, exc)

    def flush(self) -> None:
        """Wait (up to the deadline each) for messages still being sent: the last ones of a run."""
        for thread in self._threads:
            thread.join(self.timeout_s)
        self._threads = [t for t in self._threads if t.is_alive()]

    def started(self, details: dict[str, Any]) -> None:
        self.send("run started", "\n".join(f"{k}: {v}" for k, v in details.items()))

    def finished(self, summary: dict[str, Any]) -> None:
        lines = [f"eval {name}: before={s['before']:.3f} after={s['after']:.3f}" for name, s in summary.items()]
        self.send("run finished", "\n".join(lines) or "no evaluation", "success")

    def failed(self, error: BaseException) -> None:
        self.send("run failed", f"{type(error).__name__}: {error}", "failure")
