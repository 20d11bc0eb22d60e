"""Readers that turn raw inputs (book files, LaTeX papers, repository folders) into datatrove Documents."""
