"""Defenses as client-protocol hooks (`fl_privacy.fl.client.ClientHooks`).

`pastel`: the PASTEL regulariser (a `loss` hook).
"""
