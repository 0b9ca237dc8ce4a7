"""A vLLM-like simulator: vLLM's HTTP surface, prefix cache and scheduler, with modelled time.

``prefill-proxy sim`` serves it; ``create_sim_app(SimConfig(...))`` builds it in process.
"""
