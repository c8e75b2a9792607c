"""What a run tells people: terminal / Markdown summary, the HTML report and its plots, export, audit."""
