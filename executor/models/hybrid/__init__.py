"""Hybrid models: attention layers over the paged KV cache beside layers that keep a
fixed-size recurrent state per request (Gated DeltaNet linear attention, gated short
convolutions). docs/hybrid.md describes the state's accounting and its limits."""
