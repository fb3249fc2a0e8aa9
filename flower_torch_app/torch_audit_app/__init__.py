"""fl-privacy's PyTorch + Opacus Flower App (record-level canaries, a recording FedAvg)."""
