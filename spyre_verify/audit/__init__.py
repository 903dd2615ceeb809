"""`spyre-verify audit`: the on-device graph-reuse audit, its verdict, report and heatmap."""
