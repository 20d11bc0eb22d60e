"""Curation of long documents (books, papers, code repositories) as datatrove pipeline stages."""
