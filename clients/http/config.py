"""The gateway's settings (`flashd http` options), checked once."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...daemon.loopback import is_loopback_host
from ...protocol.messages import MAX_BUDGET, SPEC_MODES

__all__ = ["GatewayConfig", "DEFAULT_MAX_BODY_BYTES"]

# The largest request body (bytes). A prompt that fills a 1M-token context is ~4 MB of text, twice that
# with JSON escapes; 16 MiB leaves room for that and tool schemas, and bounds what one POST may make
# the gateway hold in memory (the body, then its parsed form, several times its size).
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(slots=True, frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"            # loopback by default: nothing outside this machine can connect
    port: int = 8000                    # 0: any free port
    api_key: str | None = None          # None: no key needed; else Bearer / x-api-key must match
                                        # (required when host is not loopback)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES   # larger request bodies: 413
    default_temperature: float = 1.0    # when a request gives none (both APIs document 1.0)
    inactivity_timeout_s: float = 600.0  # longest wait for the daemon's next event (CPU prefill is slow)
    # speculative decoding of requests that do not choose (the `spec*` request extensions): the
    # daemon's `generate spec= budget= draft=`; editors and agents cannot send extension fields
    spec: str = "off"                   # off | chain | ddtree
    spec_budget: int | None = None      # None: the daemon's default for the mode
    spec_draft: str | None = None       # None: the daemon's first --draft

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host must not be empty")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (leave it out for no key)")
        if self.api_key is None and not is_loopback_host(self.host):
            raise ValueError(f"--host {self.host} is not a loopback address: anyone who can reach it could use the "
                             f"model; set --api-key KEY (or $FLASHD_API_KEY), or listen on 127.0.0.1")
        if isinstance(self.max_body_bytes, bool) or not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be an integer >= 1, got {self.max_body_bytes!r}")
        if not (math.isfinite(self.default_temperature) and 0 <= self.default_temperature <= 2):
            raise ValueError(f"default_temperature must be in [0, 2], got {self.default_temperature}")
        if not self.inactivity_timeout_s > 0:
            raise ValueError(f"inactivity_timeout_s must be > 0, got {self.inactivity_timeout_s}")
        if self.spec not in SPEC_MODES:
            raise ValueError(f"spec must be one of {', '.join(SPEC_MODES)}, got {self.spec!r}")
        if self.spec_budget is not None and not 1 <= self.spec_budget <= MAX_BUDGET:
            raise ValueError(f"spec_budget must be in [1, {MAX_BUDGET}], got {self.spec_budget}")
        if self.spec_draft is not None and not self.spec_draft.strip():
            raise ValueError("spec_draft must not be empty (leave it out for the daemon's default drafter)")
