"""The server side of a user-app audit, for callers inside fl-privacy.

`CanaryAuditStrategy` (it records what the user's server saw each round to
`canary_rounds.npz`), the discovery of the canary nodes and the recording's format live in
`fl_privacy.flower.inapp.fl_privacy_canary_strategy`, the one implementation, which a user's
app vendors (numpy and flwr only); they are re-exported here. The analysis of a recording is
`audits.user_app` and `audits.user_rounds`.
"""

# pylint: disable=unused-import
from fl_privacy.flower.inapp.fl_privacy_canary_strategy import (
    DEFAULT_THREATS, DIRECTION_CACHE_BYTES, FORMAT, FORMAT_VERSION, ROUNDS_FILE, THREATS,
    CanaryAuditStrategy, CanaryRound, check_indices, discover_canaries, flower_stated,
    load_rounds, save_rounds)
