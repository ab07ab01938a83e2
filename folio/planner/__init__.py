"""`folio plan`: a cost model calibrated on this machine, replayed through the real Scheduler."""
