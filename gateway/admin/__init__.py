"""The admin API (docs/spec.md §28): :mod:`.api` (the endpoints), :mod:`.access` (who is an
admin), :mod:`.payloads` (the bodies, checked), :mod:`.views` (what is shown, the audit lines),
:mod:`.openapi` (its description)."""
