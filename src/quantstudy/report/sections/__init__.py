"""The report's sections, one module each; every `render_*` takes the record and returns Markdown
lines, and `report/markdown.py` joins them in the report's order."""
