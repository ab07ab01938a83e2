"""`folio simulate`: request traces replayed through the real Scheduler on simulated time."""
