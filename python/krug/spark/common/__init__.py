"""Parts of krug.spark shared by its estimators: the Store, data preparation, params."""
