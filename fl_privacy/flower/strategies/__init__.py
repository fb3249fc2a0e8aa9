"""Server-side strategies that wrap any Flower Message-API strategy (one a module).

- `base`: the wrapper they share (`check_inner`, `_Wrapper`: delegates every call it does not
  change) and the reply-weight helpers.
- `recording`: `RecordingStrategy` (records every upload, changes nothing) and
  `recording_from_uploads` (the passive attacks' recording from the recorded rounds).
- `dishonest`: `DishonestStrategy` (the 2M+1 detector of `attacks.dishonest`).
- `reconstruction`: `ReconstructionStrategy` (the imprint block of
  `attacks.reconstruction.imprint`).
"""
