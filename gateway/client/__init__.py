"""Client-side tools, apart from the server: ``gateway probe`` (:mod:`.probe`) and ``gateway
doctor`` (:mod:`.doctor`), docs/spec.md §3 and §17.

They run from the outside against any OpenAI-compatible URL. They may import the low modules
(the SSE parser, the decoders), but nothing on the gateway's request path imports this package
(docs/architecture.md; ``.importlinter`` layers it beside endpoints and pipeline).
"""
