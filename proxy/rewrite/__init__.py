"""Pure request transforms and the pipeline that runs them. No I/O in this package."""

from proxy.rewrite.pipeline import Pipeline, RewriteContext, RewriteResult, Transform

__all__ = ["Pipeline", "RewriteContext", "RewriteResult", "Transform"]
