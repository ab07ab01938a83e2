"""The paged KV cache's bookkeeping: block pool and tables, prefix cache, recurrent state
slots, the CPU swap space, and the page map (kv_map) drawn from them; kv_manager.py is the
one the scheduler talks to."""
