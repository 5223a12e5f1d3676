"""Container HEALTHCHECK: exit 0 iff the service answers 200 on /healthz.

Standard library only, because the slim runtime image has no curl or wget.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def check(port: int, path: str = "/healthz", timeout: float = 3.0) -> tuple[bool, str]:
    """Return (healthy, reason) for http://127.0.0.1:<port><path>."""
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200, f"{url}: HTTP {response.status}"
    except urllib.error.HTTPError as e:  # 503 and friends: the service answered "not healthy"
        return False, f"{url}: HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:  # nothing listening, timeout
        return False, f"{url}: {e}"


def main() -> int:
    port = int(os.environ.get("CBGP_METRICS_PORT", "9400"))
    healthy, reason = check(port)
    print(("healthy: " if healthy else "unhealthy: ") + reason, file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
