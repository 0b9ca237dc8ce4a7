"""Trace replay benchmark: agent conversations (recorded or synthetic) replayed step by
step against a server, straight or through the proxy, under client profiles that mimic
what agent frameworks do to prompts; prefill tokens, cached share and TTFT per step.

Modules: traces (format, steps), profiles (client behaviours), request (the body of a
step), response (reading a stream), runner (HTTP), records, report (summary, tables),
plot, progress, synthetic (generator), benchmark (one whole run), command (CLI).
"""
