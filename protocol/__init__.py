"""flashd's wire protocol: the request/event schema, its three encodings and the error codes.

Pure data: no I/O, no threads. SPEC.md in this folder is the user-facing reference.

  messages  requests (one dataclass per verb) and request_from_fields, the one validation path
  events    token/done/result/error/ready event constructors
  errors    ERROR_CODES and ProtocolError
  lines     the stdin/stdout line dialect (JSON Lines out)
  wire      the ZeroMQ msgpack dialect
  lucebox   the Lucebox-compatible argv, commands and int32 stream
"""

from .errors import ERROR_CODE_MEANINGS, ERROR_CODES, ProtocolError
from .events import (
    PROTOCOL_VERSION,
    TERMINAL_EVENTS,
    done_event,
    error_event,
    ready_event,
    result_event,
    token_event,
)
from .ids import IdsFile, pack_ids, unpack_ids
from .messages import (
    VERBS,
    Cancel,
    Compress,
    Detokenize,
    Free,
    Generate,
    Park,
    Quit,
    Request,
    SamplingParams,
    Score,
    Status,
    Tokenize,
    Unpark,
    request_from_fields,
    request_to_fields,
    resolve_ids_files,
    verb_of,
)

__all__ = [
    "ERROR_CODE_MEANINGS", "ERROR_CODES", "ProtocolError",
    "PROTOCOL_VERSION", "TERMINAL_EVENTS",
    "done_event", "error_event", "ready_event", "result_event", "token_event",
    "IdsFile", "pack_ids", "unpack_ids",
    "VERBS", "Cancel", "Compress", "Detokenize", "Free", "Generate", "Park", "Quit", "Request",
    "SamplingParams", "Score", "Status", "Tokenize", "Unpark",
    "request_from_fields", "request_to_fields", "resolve_ids_files", "verb_of",
]
