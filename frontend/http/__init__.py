"""The HTTP server: routes, access rules, bounded bodies, answers and the pages it serves."""
