"""Merging trained models: the streaming weighted mean and the aggregation action's logic."""
