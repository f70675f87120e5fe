"""The sections of report.html, one module per part of the page; each takes its piece of the
summary.json dictionary and returns its ``<section>`` (or header) as HTML."""
